"""Supervised warm start on teacher memory traces (the conversations the workflow produces, teacher responses).

The teacher learner (demo_task.OracleLLM) answers the workflow's own requests; the loss is the token mean of
-log p over the teacher's response tokens (EOS included), over all conversations of the batch. Two stages, both on
fresh questions only (never in the RL or held-out sets):

1. `compact_pretrain`: exact-oracle traces of one-chunk documents behind a compact prompt ("{question}\n{memory}
   \n{section}\n", no instructions, no chat template: about 50 tokens instead of 280). A randomly initialised
   tiny model does not learn to retrieve the value from the 280-token workflow prompt within a CPU budget: SFT on
   it stayed at chance for 200 updates (loss flat at 0.93 nats/token, key and value tokens at ln 16). Behind the
   compact prompt the retrieval forms in 120-200 updates (loss ~0.9 -> below 0.05) and then transfers.
2. `warm_start`: SFT on the workflow's own prompts (chat template, MemAgent's instructions) over 8-chunk documents
   from a forgetful teacher (demo.teacher_keep_probability 0.2: a found needle is carried through a
   section without one only 20% of the time, else the memory is rewritten "code {key} unknown."). Its greedy
   imitation forgets, so keeping the memory across overwrites, MemAgent's skill, is what RL adds. With the exact
   oracle the warm start's held-out accuracy at 2 chunks ranged from 47% to 98% over 5 seeds: whether the tiny
   model already kept the memory was a matter of the seed, leaving RL 2 to 53 points.
   In a gated workflow (docs/gates.md, "The demo") the teacher also writes a decision before each memory
   (demo.teacher_decisions, demo.teacher_informed); compact pretraining stays ungated, since its prompt offers no
   decision words.

Every rank runs the same warm start from the same seed on the unwrapped model before the RL learner wraps it,
so the ranks start RL from identical weights without communication.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from memagent.config import DemoConfig
from memagent.demo.task import OracleLLM
from memagent.progress import progress
from memagent.records import MEMORY, Sample, TrainRow, Trajectory
from memagent.rl.step import collate, micro_batch_logprobs, prefix_micro_batches
from memagent.rollout.chunking import iter_chunks
from memagent.rollout.prompts import WorkflowConfig
from memagent.rollout.workflow import prepare_document, run_memagent

COMPACT_MEMORY_PROMPT = "{problem}\n{memory}\n{chunk}\n"
"""Compact memory-update prompt of `compact_pretrain`: the three blocks of MemAgent's prompt, nothing else."""
COMPACT_ANSWER_PROMPT = "{problem}\n{memory}\nAnswer:"
"""Compact final-answer prompt of `compact_pretrain`."""


def _oracle_trajectories(samples: list[Sample], tokenizer: PreTrainedTokenizerBase, workflow: WorkflowConfig,
                         keep_probability: float, seed: int, decisions: tuple[float, float, float] = (0.0, 1.0, 0.0),
                         informed: float = 0.0) -> list[Trajectory]:
    teacher = OracleLLM(tokenizer, keep_probability=keep_probability, seed=seed, decisions=decisions,
                        informed=informed)
    return run_memagent(samples, teacher, workflow, group_size=1)


def oracle_rows(samples: list[Sample], tokenizer: PreTrainedTokenizerBase, workflow: WorkflowConfig, *,
                keep_probability: float = 1.0, seed: int = 0,
                decisions: tuple[float, float, float] = (0.0, 1.0, 0.0),
                informed: float = 0.0) -> list[list[TrainRow]]:
    """Per question, its teacher conversations with the workflow's own prompts, as rows (advantage unused).

    keep_probability, seed, decisions, informed: of the teacher (demo_task.OracleLLM; keep_probability 1.0 = the
    exact oracle; decisions and informed: how it gates in a gated workflow).
    """
    return [[TrainRow.from_conversation(c) for c in traj.conversations]
            for traj in _oracle_trajectories(samples, tokenizer, workflow, keep_probability, seed, decisions,
                                             informed)]


def compact_oracle_rows(samples: list[Sample], tokenizer: PreTrainedTokenizerBase, workflow: WorkflowConfig, *,
                        keep_probability: float = 1.0, seed: int = 0) -> list[list[TrainRow]]:
    """Per question, the same teacher responses as `oracle_rows`, behind COMPACT_*_PROMPT instead."""
    out = []
    for traj in _oracle_trajectories(samples, tokenizer, workflow, keep_probability, seed):
        sample = samples[traj.sample_index]
        chunks = list(iter_chunks(prepare_document(sample.context, tokenizer, workflow), tokenizer,
                                  workflow.chunk_tokens))
        before, rows = workflow.initial_memory, []
        for c in traj.conversations:
            if c.kind == MEMORY:
                prompt = COMPACT_MEMORY_PROMPT.format(problem=sample.question, memory=before, chunk=chunks[c.chunk_index])
                before = c.text
            else:
                prompt = COMPACT_ANSWER_PROMPT.format(problem=sample.question, memory=before)
            prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
            rows.append(TrainRow.from_conversation(dataclasses.replace(c, prompt_ids=prompt_ids)))
        out.append(rows)
    return out


def supervised_updates(
    model: nn.Module, batch_rows: Callable[[int], list[TrainRow]], *, steps: int, lr: float, pad_id: int,
    device: torch.device, budget: int, stop_loss: float = 0.0, desc: str, show: bool, shared_prefix: int = 0,
) -> list[float]:
    """Up to `steps` AdamW updates (10% linear warm-up, then constant lr) of the token-mean NLL of the response
    tokens of `batch_rows(u)`; stops early once the mean loss of the last 5 updates is below `stop_loss`.

    Returns the loss of each update. The token mean is over the whole batch (one normalizer for all its
    micro-batches), so the micro-batch budget does not change the update. shared_prefix: rows whose prompts share
    that many leading tokens run them once per micro-batch (memagent.rl.step.prefix_micro_batches; 0 = off): every
    workflow prompt starts with the same chat template and instructions, most of its tokens at the demo's size.
    """
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    warmup = max(1, steps // 10)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda u: min(1.0, (u + 1) / warmup))
    model.train()
    losses: list[float] = []
    for u in progress(range(steps), desc=desc, enabled=show):
        rows = batch_rows(u)
        num_tokens = sum(r.num_trained_tokens for r in rows)
        total = 0.0
        for pack, prefix in prefix_micro_batches(rows, budget, shared_prefix=shared_prefix):
            mb = collate(pack, pad_id, device, prefix)
            logp = micro_batch_logprobs(model, mb, temperature=1.0, target_mask=mb.loss_mask).logprobs
            loss = -torch.where(mb.loss_mask, logp, 0.0).sum() / num_tokens
            loss.backward()
            total += float(loss.detach())
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        losses.append(total)
        if len(losses) >= 5 and sum(losses[-5:]) / 5 < stop_loss:
            break
    return losses


def compact_pretrain(model: nn.Module, tokenizer: PreTrainedTokenizerBase, questions: Callable[[int], list[Sample]],
                     workflow: WorkflowConfig, cfg: DemoConfig, *, device: torch.device, budget: int,
                     show: bool) -> list[float]:
    """Stage 1 (module docstring): update u trains on the compact oracle traces of `questions(u)`, until the loss
    is below cfg.pretrain_stop_loss or after cfg.pretrain_steps updates. Returns the loss of each update.

    Always MemAgent's ungated traces: the compact prompt offers no decision words, so a gated workflow's decisions
    are learned in stage 2 alone."""
    workflow = dataclasses.replace(workflow, gates="none")
    return supervised_updates(
        model, lambda u: [r for rows in compact_oracle_rows(questions(u), tokenizer, workflow) for r in rows],
        steps=cfg.pretrain_steps, lr=cfg.lr, pad_id=_pad_id(tokenizer), device=device, budget=budget,
        stop_loss=cfg.pretrain_stop_loss, desc="compact pretrain", show=show)


def warm_start(model: nn.Module, tokenizer: PreTrainedTokenizerBase, samples: list[Sample], workflow: WorkflowConfig,
               cfg: DemoConfig, *, seed: int, device: torch.device, budget: int, show: bool,
               shared_prefix: int = 0) -> list[float]:
    """Stage 2: `cfg.steps` updates of SFT on the workflow's own oracle traces; returns the loss of each update.

    Update u trains on questions u*B .. (u+1)*B-1 (B = cfg.batch_questions, wrapping around), so with
    steps * B fresh questions (memagent.demo.stage's SFT questions) no question is seen twice: repeating a few thousand
    questions for several epochs let the tiny model memorize them (training loss 0.01 nats/token, held-out 2.2).
    """
    traces = oracle_rows(samples, tokenizer, workflow, keep_probability=cfg.teacher_keep_probability, seed=seed,
                         decisions=cfg.teacher_decisions, informed=cfg.teacher_informed)
    order = list(range(len(traces)))
    random.Random(seed).shuffle(order)
    b = min(cfg.batch_questions, len(traces))
    return supervised_updates(
        model, lambda u: [r for i in range(u * b, (u + 1) * b) for r in traces[order[i % len(order)]]],
        steps=cfg.steps, lr=cfg.lr, pad_id=_pad_id(tokenizer), device=device, budget=budget, desc="warm start",
        show=show, shared_prefix=shared_prefix)


def _pad_id(tokenizer: PreTrainedTokenizerBase) -> int:
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
