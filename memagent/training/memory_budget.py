"""Memory estimates of a whole run from a model's config.json alone (`train.py --dry-run`): rollout and update.

These size a run before it is launched (no weights are read). Generation memory (KV cache, prefill, rows per call)
is memagent.model.shape's; this file adds the update, with the usual first-order formulas:
- Update, per GPU: parameters, gradients and the two Adam moments in fp32 (plus DeepSpeed's bf16 parameter copy),
  each divided by the world size from the ZeRO stage that partitions it (1: optimizer states, 2: + gradients,
  3: + parameters); activations per token of one micro-batch: every layer's hidden state when gradient
  checkpointing is on, else about 34 * hidden bytes per layer-token (attention and MLP intermediates in bf16),
  plus two [512, vocab] float32 head chunks.
"""

from __future__ import annotations

import json
from pathlib import Path

from memagent.model.shape import (  # noqa: F401  (re-exported for the dry-run report and its tests)
    GIB,
    ModelShape,
    kv_bytes_per_token,
    prefill_activation_bytes,
    read_shape,
    rows_per_call,
    shape_from_config,
)


def update_bytes(
    shape: ModelShape, *, world_size: int, zero_stage: int, micro_batch_tokens: int, gradient_checkpointing: bool,
    deepspeed_bf16: bool = True,
) -> dict[str, float]:
    """Per-GPU bytes of the update: parameters, gradients, Adam states, activations, total.

    zero_stage 0 is plain DDP (nothing partitioned). Parameters and gradients are fp32 masters (4 bytes each);
    under DeepSpeed bf16 the model also holds a 2-byte copy, partitioned with the parameters at stage 3.
    """
    if zero_stage not in (0, 1, 2, 3) or world_size < 1:
        raise ValueError(f"zero_stage={zero_stage} must be 0-3 and world_size={world_size} >= 1")
    n = shape.num_params
    part = {name: world_size if zero_stage >= stage else 1 for name, stage in (("opt", 1), ("grad", 2), ("param", 3))}
    params = n * 4 / part["param"] + (n * 2 / part["param"] if deepspeed_bf16 else 0)
    grads = n * 4 / part["grad"]
    adam = n * 8 / part["opt"]
    per_layer_token = 2 * shape.hidden if gradient_checkpointing else 34 * shape.hidden
    logits = 2 * 512 * shape.vocab * 4  # memagent.model.logprobs: the head runs on 512-token chunks, fp32
    activations = micro_batch_tokens * per_layer_token * shape.layers + logits
    total = params + grads + adam + activations
    return {"params": params, "grads": grads, "adam": adam, "activations": activations, "total": total}


KNOWN_CONFIGS = {
    "Qwen/Qwen2.5-7B-Instruct": "qwen2.5-7b-instruct.config.json",
    "Qwen/Qwen2.5-14B-Instruct": "qwen2.5-14b-instruct.config.json",
}
"""Hub ids whose published config.json ships under configs/, so their presets can be sized offline."""
CONFIGS_DIR = Path(__file__).resolve().parents[2] / "configs"
TEMPLATE_TOKENS = 256
"""Allowance for the prompt template's own tokens (instructions, chat markup) in a memory-update prompt."""
GATE_TOKENS = 128
"""Further allowance under workflow.gates (docs/gates.md): the decision instructions (104 SmolLM2 tokens with both
gates) and the decision line generated on top of memory_tokens."""


def config_file_for(model_path: str) -> Path:
    """The config.json to size `model_path` from: the directory's own, or the shipped one of a known hub id."""
    local = Path(model_path).expanduser()
    if (local / "config.json").is_file() or local.is_file():
        return local / "config.json" if local.is_dir() else local
    if model_path in KNOWN_CONFIGS:
        return CONFIGS_DIR / KNOWN_CONFIGS[model_path]
    raise FileNotFoundError(
        f"model.path={model_path!r}: no config.json there and not one of {sorted(KNOWN_CONFIGS)}; pass a model "
        "directory or a config.json file"
    )


def dry_run_report(cfg, world_size: int) -> str:
    """Estimated per-GPU memory (GiB) of the rollout and the update of a TrainConfig on `world_size` ranks."""
    path = config_file_for(cfg.model.path or cfg.demo.model_dir)
    shape = read_shape(path)
    stage = 0
    if cfg.run.deepspeed:
        stage = int(json.loads(Path(cfg.run.deepspeed).read_text()).get("zero_optimization", {}).get("stage", 0))
    wf, r = cfg.workflow, cfg.rollout
    tokens = TEMPLATE_TOKENS + wf.question_tokens + wf.chunk_tokens + wf.memory_tokens + max(wf.memory_tokens, wf.answer_tokens)
    tokens += GATE_TOKENS if wf.gated else 0
    pending = -(-r.batch_size // world_size) * r.group_size
    if r.kv_cache_budget_gb > 0:
        rows = rows_per_call(shape, r.kv_cache_budget_gb * GIB, tokens, r.prefill_chunk_tokens, cap=r.max_batch_rows or None)
    else:
        rows = r.max_batch_rows or pending
    rows = min(rows, pending)
    chunk = min(r.prefill_chunk_tokens or tokens, tokens)
    update = update_bytes(shape, world_size=world_size, zero_stage=stage, micro_batch_tokens=cfg.optim.micro_batch_tokens,
                          gradient_checkpointing=cfg.model.gradient_checkpointing, deepspeed_bf16=bool(cfg.run.deepspeed))
    resident = update["params"] + update["adam"]  # gradients are freed between updates
    kv = rows * tokens * kv_bytes_per_token(shape)
    prefill = prefill_activation_bytes(shape, rows, chunk)
    gathered = shape.num_params * 2 if stage == 3 else 0  # ZeRO-3 gathers the full bf16 weights to generate
    rollout = resident + gathered + kv + prefill
    return "\n".join([
        f"model {path} ({shape.num_params / 1e9:.2f}B parameters), world size {world_size}, "
        f"{'ZeRO-' + str(stage) if cfg.run.deepspeed else 'plain PyTorch'}",
        f"rollout: {rollout / GIB:.1f} GiB per GPU ({rows} rows x {tokens} tokens per generate call: KV cache "
        f"{kv / GIB:.1f}, prefill {prefill / GIB:.1f}, weights + optimizer {(resident + gathered) / GIB:.1f})",
        f"update: {update['total'] / GIB:.1f} GiB per GPU (params {update['params'] / GIB:.1f}, grads "
        f"{update['grads'] / GIB:.1f}, adam {update['adam'] / GIB:.1f}, activations {update['activations'] / GIB:.1f})",
    ])
