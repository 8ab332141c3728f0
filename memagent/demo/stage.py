"""The demo's one stage in train.py: the tiny model, its task, and its warm start, before RL (docs/demo.md).

`DemoStage` answers the three questions the trainer's setup asks of an optional pre-RL stage
(memagent.training.setup.PreRLStage): which model (the tiny model, built once by rank 0 when model.path is empty),
which questions (code_lookup at the workflow's chunk size), and what to do to the model before the learner wraps it
(compact pretraining, then SFT from a forgetful teacher; memagent.demo.warm_start). Data seeds: RL d.seed, SFT
d.seed + 7, compact-pretraining update u d.seed + 100003 + u, held-out factor f d.seed + 1000 f + 1, so no set
repeats another's documents.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from memagent.config import TrainConfig
from memagent.demo.task import corpus, generate_code_lookup
from memagent.demo.warm_start import compact_pretrain, warm_start
from memagent.model import build_tiny_model
from memagent.records import Sample

TASK = "code_lookup"


class DemoStage:
    """The embedded demo for a TrainConfig with demo.enabled."""

    def __init__(self, cfg: TrainConfig) -> None:
        warm = cfg.demo.steps > 0 or cfg.demo.pretrain_steps > 0
        if warm and (cfg.data.task != TASK or cfg.data.train_file or cfg.data.tasks):
            raise ValueError(f"demo: the warm start's teacher knows only the {TASK} task; set data.task={TASK} and "
                             "no data.train_file or data.tasks, or demo.steps=0 and demo.pretrain_steps=0")
        self.cfg = cfg

    def model_path(self, rank: int, barrier: Callable[[], None]) -> str:
        """model.path, or the tiny model (tokenizer trained on the demo task's text), built once by rank 0."""
        if self.cfg.model.path:
            return self.cfg.model.path
        d = self.cfg.demo
        path = Path(d.model_dir)
        if rank == 0 and not (path / "config.json").is_file():
            build_tiny_model(path, hidden_size=d.hidden_size, num_layers=d.num_layers,
                             intermediate_size=d.intermediate_size, vocab_size=d.vocab_size, corpus=corpus(),
                             seed=self.cfg.run.seed)
        barrier()
        return str(path)

    def _questions(self, tokenizer: Any, n: int, chunks: int, seed: int) -> list[Sample]:
        return generate_code_lookup(tokenizer, num_chunks=chunks, chunk_tokens=self.cfg.workflow.chunk_tokens,
                                    num_samples=n, seed=seed, distractors=self.cfg.demo.distractors)

    def data(self, tokenizer: Any) -> tuple[list[Sample], dict[str, list[Sample]]] | None:
        """code_lookup training questions and held-out sets keyed "{f}x"; None when the data is another task, a
        task mix or a file."""
        d = self.cfg.data
        if d.task != TASK or d.train_file or d.tasks:
            return None
        train = self._questions(tokenizer, d.num_train, d.train_chunks, d.seed)
        heldout = {f"{f}x": self._questions(tokenizer, d.num_eval, d.train_chunks * f, d.seed + 1000 * f + 1)
                   for f in d.eval_chunk_factors}
        return train, heldout

    def warm_start(self, model: nn.Module, tokenizer: Any, device: torch.device, rank: int) -> bool:
        """Compact pretraining, then SFT on the workflow's traces, on the unwrapped model (every rank trains its own
        copy on the same questions). Returns whether any update ran."""
        cfg, d, seed = self.cfg, self.cfg.demo, self.cfg.data.seed
        show = cfg.run.progress and rank == 0
        budget = cfg.optim.micro_batch_tokens
        ran = False
        if d.pretrain_steps > 0:
            t = time.perf_counter()
            losses = compact_pretrain(
                model, tokenizer, lambda u: self._questions(tokenizer, d.pretrain_batch, d.pretrain_chunks,
                                                            seed + 100_003 + u),
                cfg.workflow, d, device=device, budget=budget, show=show)
            ran = True
            if rank == 0:
                print(f"compact pretrain: {len(losses)} updates, loss {losses[0]:.3f} -> {losses[-1]:.3f} "
                      f"({time.perf_counter() - t:.0f} s)", flush=True)
        if d.steps > 0:
            t = time.perf_counter()
            sft = self._questions(tokenizer, d.steps * d.batch_questions, d.chunks, seed + 7)
            losses = warm_start(model, tokenizer, sft, cfg.workflow, d, seed=cfg.run.seed, device=device,
                                budget=budget, show=show, shared_prefix=cfg.optim.shared_prefix_tokens)
            ran = True
            if rank == 0:
                print(f"warm start: {len(losses)} SFT updates, loss {losses[0]:.3f} -> {losses[-1]:.3f} "
                      f"({time.perf_counter() - t:.0f} s)", flush=True)
        return ran
