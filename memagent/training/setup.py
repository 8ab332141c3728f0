"""Plumbing of train.py: output dir, seeds, device, process group, model and tokenizer, data, an optional pre-RL
stage, the learner, resume.

Order matters: a pre-RL stage (the demo's supervised warm start) trains the plain model BEFORE the learner wraps it
(DeepSpeed copies the weights into its own flat or partitioned buffers at wrap time; training the module afterwards
would be undone by ZeRO-1's first step, double-count gradients under ZeRO-2 and meet empty partitions under ZeRO-3),
and the KL reference is a copy of the model RL starts from. A warm-started model is also saved to
OUTPUT_DIR/warm_start (the reference of a resumed run, and a model to evaluate on its own). LoRA (model.lora_rank)
adapts the model after any warm start and before the learner builds its optimizer, which then holds the adapters
alone; a resumed LoRA run loads its frozen base from warm_start when there is one, since its checkpoints hold only
the adapters.
Everything here fails early with a clear message (no model path, empty data, fewer questions than a batch, an
unwritable output dir; group_size < 2 is refused by the config itself).
"""

from __future__ import annotations

import copy
import json
import os
import random
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn

from memagent.config import TrainConfig
from memagent.data import TASKS, make_task, read_samples
from memagent.data.mix import make_task_mix, parse_task_mix
from memagent.model import load_model, load_tokenizer
from memagent.model.compiled import compile_elementwise
from memagent.model.lora import AdaptersOff, apply_lora, load_adapters
from memagent.model.precision import arithmetic_name, storage_dtype, training_autocast
from memagent.records import Sample
from memagent.training.checkpoint import (
    config_changes,
    list_checkpoints,
    resolve_resume,
    saved_config,
    warn_if_arithmetic_changed,
)
from memagent.training.learner import (
    Learner,
    dist_env,
    init_process_group,
    make_learner,
    pick_device,
    resolve_deepspeed_path,
)


class PreRLStage(Protocol):
    """An optional stage before RL (the demo's, memagent.demo.DemoStage): a model, data, and a warm start."""

    def model_path(self, rank: int, barrier: Callable[[], None]) -> str:
        """The policy's HF directory (the stage may build it; rank 0 only, then `barrier()`)."""
        ...

    def data(self, tokenizer: Any) -> tuple[list[Sample], dict[str, list[Sample]]] | None:
        """Training and held-out questions of the stage's own task, or None to use data.* as usual."""
        ...

    def warm_start(self, model: nn.Module, tokenizer: Any, device: torch.device, rank: int) -> bool:
        """Train the unwrapped model before RL; return whether it changed."""
        ...


@dataclass
class TrainingSetup:
    """What the training loop works with, built once by `set_up_training`."""

    cfg: TrainConfig
    learner: Learner
    """The policy, its optimizer and the collectives (one process, DDP or DeepSpeed)."""
    tokenizer: Any
    train: list[Sample]
    heldout: dict[str, list[Sample]]
    """Held-out sets by name ("1x", "4x": multiples of the training length; or "file")."""
    generator: torch.Generator
    """The rollout sampler's random stream (seeded per rank; saved in checkpoints)."""
    device: torch.device
    reference: nn.Module | None
    """Frozen KL reference (only with loss.kl_coef > 0)."""
    resume_from: Path | None
    autocast_dtype: torch.dtype | None = None
    """bf16 autocast of rollout, log-prob and update forwards over the fp32 weights (memagent.model.precision)."""
    arithmetic: str = "float32"
    """The weights' dtype and autocast in words (precision.arithmetic_name), recorded in each checkpoint."""


def writable_output_dir(path: str | Path) -> Path:
    """Create the output dir and prove it is writable."""
    out = Path(path)
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".write-test-{os.getpid()}"
        probe.write_text("ok")
        probe.unlink()
    except OSError as err:
        raise PermissionError(f"--output-dir {out}: not writable ({err.strerror}); pass a directory you can write") from err
    return out


def check_output_dir(path: str | Path, resume: str) -> Path:
    """Refuse to overwrite checkpoints unless resuming. The dir exists and is writable: train.main made it so
    (writable_output_dir) before locking it."""
    out = Path(path)
    if not resume and list_checkpoints(out):
        raise FileExistsError(f"--output-dir {out} already has checkpoints: pass --resume to continue, or a new dir")
    return out


def check_resumed_config(cfg: TrainConfig, checkpoint: Path, out: Path) -> None:
    """Refuse to resume under other settings than the checkpoint's (checkpoint.config_changes lists them), unless
    run.allow_config_change, which warns instead: a run mixed from two recipes is not one experiment."""
    saved = saved_config(checkpoint, out)
    if saved is None:
        return
    changes = config_changes(saved, asdict(cfg), asdict(TrainConfig()))
    if not changes:
        return
    listed = "; ".join(changes)
    if cfg.run.allow_config_change:
        warnings.warn(f"--resume {checkpoint}: continuing under changed settings: {listed}", stacklevel=2)
        return
    raise ValueError(f"--resume {checkpoint}: the run was trained with other settings ({listed}); resume with its "
                     "own settings, or pass --run.allow-config-change true to continue under the new ones")


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def load_data(cfg: TrainConfig, tokenizer: Any) -> tuple[list[Sample], dict[str, list[Sample]]]:
    """Training questions and held-out sets: files, or a memagent.data.TASKS generator at the workflow's length.

    Synthetic sets: training train_chunks x chunk_tokens context tokens (seed d.seed); held-out set "{f}x" f times
    that (seed d.seed + 1000 f + 1), so no set repeats another's documents. With a task mix (data.tasks) every set
    splits its questions over the tasks by weight (memagent.data.mix).
    """
    d, chunk = cfg.data, cfg.workflow.chunk_tokens
    if d.train_file:
        return read_samples(d.train_file), ({"file": read_samples(d.eval_file)} if d.eval_file else {})
    if d.tasks:
        shares = parse_task_mix(d.tasks)
        train = make_task_mix(shares, tokenizer, d.train_chunks * chunk, d.num_train, seed=d.seed)
        heldout = {f"{f}x": make_task_mix(shares, tokenizer, d.train_chunks * chunk * f, d.num_eval,
                                          seed=d.seed + 1000 * f + 1) for f in d.eval_chunk_factors}
        return train, heldout
    if d.task not in TASKS:
        hint = " (the demo's task: pass --preset tiny or --demo.enabled true)" if d.task == "code_lookup" else ""
        raise ValueError(f"data.task={d.task!r}: expected one of {sorted(TASKS)}{hint}, or pass data.train_file")
    train = make_task(d.task, tokenizer, d.train_chunks * chunk, d.num_train, seed=d.seed)
    heldout = {f"{f}x": make_task(d.task, tokenizer, d.train_chunks * chunk * f, d.num_eval, seed=d.seed + 1000 * f + 1)
               for f in d.eval_chunk_factors}
    return train, heldout


def check_data(cfg: TrainConfig, train: list[Sample]) -> None:
    if not train:
        raise ValueError("the training set is empty: pass --data.num-train > 0 or a non-empty data.train_file")
    if len(train) < cfg.rollout.batch_size:
        raise ValueError(f"the training set has {len(train)} questions, fewer than rollout.batch_size="
                         f"{cfg.rollout.batch_size}: lower the batch size or add questions")


def adapt(model: nn.Module, cfg: TrainConfig) -> None:
    """Wrap model.lora_targets in rank-model.lora_rank adapters and freeze everything else (in place); with
    model.lora_init, the adapters start from that file's (a resumed run then loads its checkpoint's over them)."""
    m = cfg.model
    try:
        apply_lora(model, rank=m.lora_rank, alpha=m.lora_alpha, target_modules=m.lora_targets)
    except ValueError as err:  # a name the loaded model does not have: say which flag to fix
        raise ValueError(f"model.lora_targets={m.lora_targets!r}: {err}") from err
    if m.lora_init:
        if not Path(m.lora_init).is_file():
            raise ValueError(f"model.lora_init={m.lora_init!r}: no such file")
        try:
            load_adapters(model, m.lora_init)
        except ValueError as err:  # another rank, alpha or set of layers than this run's
            raise ValueError(f"model.lora_init={m.lora_init!r} does not fit this run's adapters: {err}") from err


def set_up_training(cfg: TrainConfig, stage: PreRLStage | None = None) -> TrainingSetup:
    """Set up everything in order (module docstring); `stage` is the optional pre-RL stage."""
    rank, world, local_rank = dist_env()
    if not cfg.model.path and stage is None:
        raise ValueError("model.path is empty: pass --model.path DIR (an HF model directory), or run the demo "
                         "(no --model.path, or --preset tiny)")
    out = check_output_dir(cfg.run.output_dir, cfg.run.resume)
    resume_from = resolve_resume(cfg.run.resume, out)
    if resume_from is not None:
        check_resumed_config(cfg, resume_from, out)
    device = pick_device(cfg.run.device, local_rank)
    init_process_group(device, cfg.run.collective_timeout_s)
    barrier = (lambda: torch.distributed.barrier()) if world > 1 else (lambda: None)
    seed_everything(cfg.run.seed)
    path = stage.model_path(rank, barrier) if stage is not None else cfg.model.path
    tokenizer = load_tokenizer(path)
    deepspeed_path = resolve_deepspeed_path(cfg.run.deepspeed, os.environ)
    lora = cfg.model.lora_rank > 0
    if lora and deepspeed_path:  # accelerate's DeepSpeed config file bypasses the config's own check
        raise ValueError(f"model.lora_rank={cfg.model.lora_rank} with DeepSpeed ({deepspeed_path}): LoRA runs on "
                         "plain PyTorch (one GPU or DDP under torchrun); launch without DeepSpeed")
    # fp32 masters unless DeepSpeed; a LoRA base is frozen, so it may be stored in bf16
    dtype = storage_dtype(cfg.model.dtype, device, deepspeed=bool(deepspeed_path), frozen_base=lora)
    amp = training_autocast(cfg.model.autocast, device, dtype)
    arithmetic = arithmetic_name(dtype, amp)
    if resume_from is not None and rank == 0:
        warn_if_arithmetic_changed(resume_from, arithmetic)
    warm_dir = out / "warm_start"
    base = warm_dir if lora and resume_from is not None and (warm_dir / "config.json").is_file() else path
    model = load_model(base, dtype=dtype, device=device, gradient_checkpointing=cfg.model.gradient_checkpointing)
    model.train()
    data = stage.data(tokenizer) if stage is not None else None
    train, heldout = data if data is not None else load_data(cfg, tokenizer)
    check_data(cfg, train)
    if rank == 0:
        (out / "config.json").write_text(json.dumps(asdict(cfg), indent=1))
    # Not under autocast: the warm start steps its optimizer, and autocast would keep serving bf16 copies of the
    # weights from before the first step until its context exits (memagent.rl.step.update_policy).
    warmed = resume_from is None and stage is not None and stage.warm_start(model, tokenizer, device, rank)
    if warmed:
        if rank == 0:
            model.save_pretrained(warm_dir)
        barrier()
    if lora:
        adapt(model, cfg)
    reference: nn.Module | None = None
    if lora and cfg.loss.kl_coef > 0:
        # RL starts from base + B A with B = 0, i.e. the frozen base itself: bypassing the adapters gives it
        # exactly, sharing the policy's weights, where a deep copy would hold a second model (a 7B one on one GPU).
        # (model.lora_init starts elsewhere, so the config refuses it with a KL term.)
        reference = AdaptersOff(model)
    elif cfg.loss.kl_coef > 0:  # the policy RL starts from: the warm-started model (saved for a resumed run)
        reference = copy.deepcopy(model) if resume_from is None else load_model(
            warm_dir if (warm_dir / "config.json").is_file() else path, dtype=dtype, device=device)
        reference.eval().requires_grad_(False)
    if cfg.model.compile:  # after the KL reference's copy, which stays eager
        compile_elementwise(model)
    generator = torch.Generator(device=device).manual_seed(cfg.run.seed * 1000 + rank)
    learner = make_learner(model, cfg.optim, device, deepspeed_path, dtype)
    return TrainingSetup(cfg, learner, tokenizer, train, heldout, generator, device, reference, resume_from, amp,
                         arithmetic)
