"""Atomic checkpoints and exact resume.

A checkpoint is a directory `OUTPUT/checkpoints/step_NNNNNN/` holding
    model/                 the policy in HF format (save_pretrained, safetensors) plus its tokenizer: loadable by
                           transformers alone
    optimizer.pt           AdamW and lr-schedule states (plain / DDP), or deepspeed/ (DeepSpeed's own layout,
                           one optimizer partition per rank)
    trainer_state.json     step, data-stream position, the config it was trained with
    rng_rank{R}.pt         python, numpy, torch (and CUDA) RNG states and the rollout torch.Generator of rank R
    adapter.safetensors    LoRA runs only: the adapters (A and B of every adapted layer, float32, with rank and
                           alpha), which resume restores onto the frozen base; model/ then holds the merged weights
                           W + (alpha / r) B A, so it loads with transformers alone like any other checkpoint. The
                           adapter file is exact; model/ is float32 whatever the base's dtype (a bf16 model/ would
                           round away most of a small update), or the dtype asked for, with a warning of the loss
Everything is written into `checkpoints/.tmp-step_NNNNNN/`, files fsynced, then the directory is renamed into place
and its parent fsynced: a kill at any moment leaves the previous checkpoint intact (a rename is atomic on POSIX),
and a half-written temp directory is never mistaken for a checkpoint. Re-saving an existing step moves the old copy to
`.old-step_NNNNNN/` first and deletes it only after the new one is in place; a kill in between leaves the old copy,
which `list_checkpoints` still finds. Older checkpoints beyond `keep` are deleted only after the new one is in place.
"""

from __future__ import annotations

import copy
import json
import os
import random
import re
import shutil
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from memagent.model.lora import load_adapters, lora_modules, merged_state_dict, rounding_loss, save_adapters
from memagent.model.precision import dtype_name
from memagent.training.learner import Learner

STEP_DIR = re.compile(r"^step_(\d{6,})$")
ASIDE_DIR = re.compile(r"^\.old-step_(\d{6,})$")
"""A complete checkpoint moved aside while the same step is re-saved; it counts until the new one is in place."""
ADAPTER_FILE = "adapter.safetensors"


def checkpoint_root(output_dir: str | Path) -> Path:
    return Path(output_dir) / "checkpoints"


def list_checkpoints(output_dir: str | Path) -> list[Path]:
    """Complete checkpoints of an output dir, oldest first (temp directories are ignored)."""
    root = checkpoint_root(output_dir)
    if not root.is_dir():
        return []
    found = {int(m.group(1)): p for p in root.iterdir() if (m := STEP_DIR.match(p.name)) and p.is_dir()}
    for p in root.iterdir():  # a re-save killed between moving the old copy aside and installing the new one
        if (m := ASIDE_DIR.match(p.name)) and p.is_dir():
            found.setdefault(int(m.group(1)), p)
    return [found[step] for step in sorted(found)]


def resolve_resume(resume: str, output_dir: str | Path) -> Path | None:
    """"" -> None; "latest" -> the newest checkpoint of output_dir (error if none); else that path (must exist)."""
    if not resume:
        return None
    if resume == "latest":
        found = list_checkpoints(output_dir)
        if not found:
            raise FileNotFoundError(f"--resume: no checkpoint under {checkpoint_root(output_dir)}")
        return found[-1]
    path = Path(resume)
    if not (path / "trainer_state.json").is_file():
        raise FileNotFoundError(f"--resume {resume}: not a checkpoint directory (no trainer_state.json)")
    return path


RESUMABLE_CHANGES = frozenset({
    "run.steps", "run.resume", "run.output_dir", "run.device", "run.deepspeed", "run.save_every", "run.keep_checkpoints",
    "run.trace_every", "run.progress", "run.collective_timeout_s", "run.allow_config_change", "eval.every",
    "model.compile", "rollout.max_batch_rows", "rollout.kv_cache_budget_gb", "rollout.prefill_chunk_tokens",
    "optim.micro_batch_tokens",
})
"""Settings a resumed run may change without a flag: how far it goes, where and how often it writes, the learner's
backend (a DeepSpeed checkpoint resumes in one plain process, tests/train/test_faults.py), and speed or memory knobs
under which the arithmetic is the same (micro-batches sum to the same gradient, prefill slices give the same cache).
Anything else changes what the resumed steps optimise."""


def warn_if_arithmetic_changed(checkpoint: Path, arithmetic: str) -> None:
    """Warn when a run resumes in other arithmetic than its checkpoint recorded (trainer_state.json "arithmetic").

    `model.autocast auto` is bf16 where the device multiplies bf16 natively and off elsewhere, so the same command
    resumed on another machine class trains its remaining steps in other arithmetic: allowed (a run may have to
    move), but its curve is no longer one arithmetic's, so it is said. A checkpoint from before the record is silent.
    """
    saved = json.loads((checkpoint / "trainer_state.json").read_text()).get("arithmetic")
    if saved is not None and saved != arithmetic:
        warnings.warn(f"{checkpoint} was trained in {saved}; this run resumes in {arithmetic} (model.autocast auto "
                      f"resolves per machine): the steps from here on compute otherwise. To keep the checkpoint's "
                      f"arithmetic, set model.autocast explicitly (with --run.allow-config-change true)", stacklevel=2)


def _flat(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"run": {"steps": 8}} -> {"run.steps": 8}; tuples and lists compare alike."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = list(value) if isinstance(value, tuple) else value
    return out


def config_changes(saved: dict[str, Any], now: dict[str, Any], defaults: dict[str, Any]) -> list[str]:
    """"field: saved -> now" for every setting outside RESUMABLE_CHANGES that differs. saved, now, defaults: nested
    dicts of TrainConfig (dataclasses.asdict or its JSON); a field the saved run did not have yet (older code)
    counts as its default."""
    old, new, default = _flat(saved), _flat(now), _flat(defaults)
    return [f"{name}: {old.get(name, default.get(name))!r} -> {value!r}" for name, value in sorted(new.items())
            if name not in RESUMABLE_CHANGES and old.get(name, default.get(name)) != value]


def saved_config(checkpoint: Path, output_dir: Path) -> dict[str, Any] | None:
    """The settings a checkpoint was trained with: its trainer_state.json's config, or (checkpoints written before it
    held a dict) the run's config.json; None when neither is there."""
    recorded = json.loads((checkpoint / "trainer_state.json").read_text()).get("config")
    if isinstance(recorded, dict):
        return recorded
    run_config = output_dir / "config.json"
    return json.loads(run_config.read_text()) if run_config.is_file() else None


def rng_state(generator: torch.Generator) -> dict[str, Any]:
    """All random states that influence training on this rank."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
             "generator": generator.get_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any], generator: torch.Generator) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    generator.set_state(state["generator"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _fsync_tree(path: Path) -> None:
    """fsync every file under path, then the directories themselves."""
    for dirpath, _, files in os.walk(path):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(Path(dirpath))


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(
    learner: Learner, tokenizer: Any, output_dir: str | Path, step: int, trainer_state: dict[str, Any],
    generator: torch.Generator, *, keep: int, merged_dtype: torch.dtype = torch.float32,
) -> Path:
    """Write checkpoint `step` atomically (all ranks call this; rank 0 renames). Returns its final path.

    merged_dtype: the dtype of a LoRA run's merged model/ (see `save_model`).
    """
    root = checkpoint_root(output_dir)
    final = root / f"step_{step:06d}"
    tmp = root / f".tmp-step_{step:06d}"
    if learner.rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    learner.barrier()
    with learner.full_parameters() as module:
        if learner.rank == 0:
            save_model(module, tokenizer, tmp, merged_dtype=merged_dtype)
    learner.save_optimizer(tmp)
    torch.save(rng_state(generator), tmp / f"rng_rank{learner.rank}.pt")
    if learner.rank == 0:
        (tmp / "trainer_state.json").write_text(json.dumps({"step": step, **trainer_state}, indent=1, default=str))
    learner.barrier()
    if learner.rank == 0:
        _fsync_tree(tmp)
        aside = root / f".old-step_{step:06d}"
        if final.exists():  # re-saving a step (e.g. after a resume): move the old copy aside, never delete it first
            shutil.rmtree(aside, ignore_errors=True)
            os.replace(final, aside)
            _fsync_dir(root)
        os.replace(tmp, final)
        _fsync_dir(root)
        shutil.rmtree(aside, ignore_errors=True)
        for old in list_checkpoints(output_dir)[:-keep]:
            shutil.rmtree(old)
    learner.barrier()
    return final


def save_model(module: torch.nn.Module, tokenizer: Any, directory: Path, *,
               merged_dtype: torch.dtype = torch.float32) -> None:
    """directory/model in HF format with the tokenizer; a LoRA model also writes its adapters, and its model/ holds
    the merged weights (built beside the live layers, which go on training unchanged) in merged_dtype.

    A merged_dtype narrower than float32 warns with the share of the update that rounding loses (`rounding_loss`):
    over a bf16 base, bf16 weights keep little of an update of 0.1% of |W|, and only adapter.safetensors is exact.
    """
    if lora_modules(module):
        save_adapters(module, directory / ADAPTER_FILE)
        if merged_dtype != torch.float32:
            lost = rounding_loss(module, merged_dtype)
            warnings.warn(f"{directory / 'model'}: merged weights saved in {dtype_name(merged_dtype)} "
                          f"lose {100 * lost:.0f}% of the LoRA update to rounding; {ADAPTER_FILE} beside it is exact",
                          stacklevel=2)
        module.save_pretrained(directory / "model", state_dict=merged_state_dict(module, dtype=merged_dtype),
                               safe_serialization=True)
        # save_pretrained records the live model's dtype (the base's); a loader's dtype="auto" must read the saved one
        config = copy.deepcopy(module.config)
        config.dtype = merged_dtype
        config.save_pretrained(directory / "model")
    else:
        module.save_pretrained(directory / "model", safe_serialization=True)
    tokenizer.save_pretrained(directory / "model")


def load_checkpoint(learner: Learner, path: Path, generator: torch.Generator) -> dict[str, Any]:
    """Restore weights, optimizer, schedule and RNG states in place; returns trainer_state.json."""
    from safetensors.torch import load_file

    state = json.loads((path / "trainer_state.json").read_text())
    adapted, has_adapters = bool(lora_modules(learner.unwrapped)), (path / ADAPTER_FILE).is_file()
    if adapted != has_adapters:  # model/ alone cannot restore either kind of run: the optimizer state would not fit
        raise ValueError(f"{path}: a {'LoRA' if has_adapters else 'full fine-tuning'} checkpoint; resume it with "
                         f"the model.lora_rank it was trained with ({'> 0' if has_adapters else '0'})")
    if adapted:
        load_adapters(learner.unwrapped, path / ADAPTER_FILE)
    elif not learner.optimizer_restores_weights:
        weights: dict[str, torch.Tensor] = {}
        for file in sorted((path / "model").glob("*.safetensors")):
            weights.update(load_file(str(file), device="cpu"))
        missing, unexpected = learner.unwrapped.load_state_dict(weights, strict=False)
        # Tied embeddings are saved once; anything else missing means a different model.
        if unexpected or any("lm_head" not in k for k in missing):
            raise ValueError(f"{path}: checkpoint does not match the model (missing {missing}, unexpected {unexpected})")
    learner.load_optimizer(path)
    rng_file = path / f"rng_rank{learner.rank}.pt"
    if not rng_file.is_file():
        raise FileNotFoundError(f"{rng_file}: resuming needs the same number of ranks as the checkpointed run")
    set_rng_state(torch.load(rng_file, weights_only=False), generator)
    return state
