"""Plumbing of train.py: output dir, seeds, device, process group, model and tokenizer, data, warm start, backend,
resume.

Order matters: the supervised warm start trains the plain model BEFORE a backend wraps it (DeepSpeed copies the
weights into its own flat or partitioned buffers at wrap time; training the module afterwards would be undone by
ZeRO-1's first step, double-count gradients under ZeRO-2 and meet empty partitions under ZeRO-3), and the KL
reference is a copy of the warm-started model, i.e. the policy RL starts from. The warm-started model is also saved
to OUTPUT_DIR/warm_start (the reference of a resumed run, and a model to evaluate on its own).
Everything here fails early with a clear message (empty data, fewer questions than a batch, an unwritable
output dir, group_size < 2 is refused by the config itself).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from memagent.config import TrainConfig
from memagent.data.records import Sample
from memagent.model import build_tiny_model, load_model, load_tokenizer
from memagent.model.precision import autocast, storage_dtype, training_autocast
from memagent.rollout.prompts import MemoryConfig
from memagent.training.backend import (
    Backend,
    dist_env,
    init_process_group,
    make_backend,
    pick_device,
    resolve_deepspeed_path,
)
from memagent.training.checkpoint import list_checkpoints, resolve_resume
from memagent.training.demo_task import corpus, generate_code_lookup
from memagent.training.warm_start import compact_pretrain, warm_start


@dataclass
class Run:
    """What the training loop works with, built once."""

    cfg: TrainConfig
    backend: Backend
    tokenizer: Any
    memory: MemoryConfig
    train: list[Sample]
    heldout: dict[str, list[Sample]]
    generator: torch.Generator
    device: torch.device
    reference: nn.Module | None
    resume_from: Path | None
    autocast_dtype: torch.dtype | None = None
    """bf16 autocast of rollout, log-prob and update forwards over the fp32 weights (memagent.model.precision)."""


def check_output_dir(path: str | Path, resume: str) -> Path:
    """Create the output dir and prove it is writable; refuse to overwrite checkpoints unless resuming."""
    out = Path(path)
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".write-test-{os.getpid()}"
        probe.write_text("ok")
        probe.unlink()
    except OSError as err:
        raise PermissionError(f"--output-dir {out}: not writable ({err.strerror}); pass a directory you can write") from err
    if not resume and list_checkpoints(out):
        raise FileExistsError(f"--output-dir {out} already has checkpoints: pass --resume to continue, or a new dir")
    return out


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def model_path(cfg: TrainConfig, rank: int, barrier: Any) -> str:
    """cfg.model.path, or the tiny model (tokenizer trained on the demo task's text), built once by rank 0."""
    if cfg.model.path:
        return cfg.model.path
    m = cfg.model
    path = Path(m.tiny_dir)
    if rank == 0 and not (path / "config.json").is_file():
        build_tiny_model(path, hidden_size=m.tiny_hidden_size, num_layers=m.tiny_num_layers,
                         intermediate_size=m.tiny_intermediate_size, vocab_size=m.tiny_vocab_size,
                         corpus=corpus(), seed=cfg.run.seed)
    barrier()
    return str(path)


def load_data(cfg: TrainConfig, tokenizer: Any) -> tuple[
        list[Sample], list[Sample], Callable[[int], list[Sample]] | None, dict[str, list[Sample]]]:
    """Training questions, SFT and compact-pretraining questions, held-out sets keyed "{N}x" (N x training chunks).

    The generators' seeds differ per set (RL d.seed, SFT d.seed + 7, compact-pretraining update u
    d.seed + 100003 + u, held-out d.seed + 1000 f + 1), so no set repeats another's documents.
    """
    d, wf = cfg.data, cfg.workflow
    if d.train_file:
        from memagent import data as data_module

        reader = getattr(data_module, "read_samples", None)
        if reader is None:
            raise NotImplementedError("data.train_file needs memagent.data.read_samples, which is not available")
        train = reader(d.train_file)
        heldout = {"file": reader(d.eval_file)} if d.eval_file else {}
        warm: list[Sample] = []
        pretrain = None
    else:
        if d.task != "code_lookup":
            raise ValueError(f"data.task={d.task!r}: the synthetic trainer task is 'code_lookup' (or pass data.train_file)")
        make = lambda n, chunks, seed: generate_code_lookup(  # noqa: E731
            tokenizer, num_chunks=chunks, chunk_tokens=wf.chunk_tokens, num_samples=n, seed=seed,
            distractors=d.distractors)
        train = make(d.num_train, d.train_chunks, d.seed)
        ws = cfg.warm_start
        warm = make(ws.steps * ws.batch_questions, ws.chunks, d.seed + 7) if ws.steps > 0 else []
        pretrain = None
        if ws.pretrain_steps > 0:
            pretrain = lambda u: make(ws.pretrain_batch, ws.pretrain_chunks, d.seed + 100_003 + u)  # noqa: E731
        heldout = {f"{f}x": make(d.num_eval, d.train_chunks * f, d.seed + 1000 * f + 1) for f in d.eval_chunk_factors}
    if not train:
        raise ValueError("the training set is empty: pass --data.num-train > 0 or a non-empty data.train_file")
    if len(train) < cfg.rollout.batch_size:
        raise ValueError(f"the training set has {len(train)} questions, fewer than rollout.batch_size="
                         f"{cfg.rollout.batch_size}: lower the batch size or add questions")
    return train, warm, pretrain, heldout


def warm_start_model(cfg: TrainConfig, model: nn.Module, tokenizer: Any, memory: MemoryConfig, warm: list[Sample],
                     pretrain: Callable[[int], list[Sample]] | None, device: torch.device, rank: int) -> bool:
    """Compact pretraining, then SFT on the workflow's traces (memagent.training.warm_start), on the unwrapped model.
    Every rank trains its own copy on the same questions. Returns whether any update ran."""
    show = cfg.run.progress and rank == 0
    budget = cfg.optim.micro_batch_tokens
    ran = False
    if pretrain is not None:
        t = time.perf_counter()
        losses = compact_pretrain(model, tokenizer, pretrain, memory, cfg.warm_start, device=device, budget=budget,
                                  show=show)
        ran = True
        if rank == 0:
            print(f"compact pretrain: {len(losses)} updates, loss {losses[0]:.3f} -> {losses[-1]:.3f} "
                  f"({time.perf_counter() - t:.0f} s)", flush=True)
    if cfg.warm_start.steps > 0 and warm:
        t = time.perf_counter()
        losses = warm_start(model, tokenizer, warm, memory, cfg.warm_start, seed=cfg.run.seed, device=device,
                            budget=budget, show=show)
        ran = True
        if rank == 0:
            print(f"warm start: {len(losses)} SFT updates, loss {losses[0]:.3f} -> {losses[-1]:.3f} "
                  f"({time.perf_counter() - t:.0f} s)", flush=True)
    return ran


def build_run(cfg: TrainConfig) -> Run:
    """Set up everything in order; see the module docstring for the checks."""
    rank, world, local_rank = dist_env()
    out = check_output_dir(cfg.run.output_dir, cfg.run.resume)
    resume_from = resolve_resume(cfg.run.resume, out)
    device = pick_device(cfg.run.device, local_rank)
    init_process_group(device)
    barrier = (lambda: torch.distributed.barrier()) if world > 1 else (lambda: None)
    seed_everything(cfg.run.seed)
    path = model_path(cfg, rank, barrier)
    tokenizer = load_tokenizer(path)
    deepspeed_path = resolve_deepspeed_path(cfg.run.deepspeed, os.environ)
    dtype = storage_dtype(cfg.model.dtype, device, deepspeed=bool(deepspeed_path))  # fp32 masters unless DeepSpeed
    amp = training_autocast(cfg.model.autocast, device, dtype)
    model = load_model(path, dtype=dtype, device=device, gradient_checkpointing=cfg.model.gradient_checkpointing)
    model.train()
    memory = MemoryConfig(**dataclasses.asdict(cfg.workflow))
    train, warm, pretrain, heldout = load_data(cfg, tokenizer)
    if rank == 0:
        (out / "config.json").write_text(json.dumps(dataclasses.asdict(cfg), indent=1))
    warm_dir = out / "warm_start"
    with autocast(device, amp):
        warmed = resume_from is None and warm_start_model(cfg, model, tokenizer, memory, warm, pretrain, device, rank)
    if warmed:
        if rank == 0:
            model.save_pretrained(warm_dir)
        barrier()
    reference = None
    if cfg.loss.kl_coef > 0:  # the policy RL starts from: the warm-started model (saved for a resumed run)
        reference = copy.deepcopy(model) if resume_from is None else load_model(
            warm_dir if (warm_dir / "config.json").is_file() else path, dtype=dtype, device=device)
        reference.eval().requires_grad_(False)
    generator = torch.Generator(device=device).manual_seed(cfg.run.seed * 1000 + rank)
    backend = make_backend(model, cfg.optim, device, deepspeed_path, dtype)
    return Run(cfg, backend, tokenizer, memory, train, heldout, generator, device, reference, resume_from, amp)
