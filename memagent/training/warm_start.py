"""Supervised warm start on oracle memory traces (the conversations the workflow produces, oracle responses).

The oracle backend (demo_task.OracleLLM) answers the workflow's own requests, so the prompts are exactly those of
rollout; the loss is the token mean of -log p over the oracle response tokens (EOS included), over all
conversations of the batch. Every rank runs the same warm start from the same seed on the unwrapped model before
the RL backend wraps it, so the ranks start RL from identical weights without communication. Deliberately short:
the warm start should be partial, leaving RL something to learn.
"""

from __future__ import annotations

import random

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from memagent.config import WarmStartConfig
from memagent.data.records import Sample
from memagent.model.logprobs import token_logprobs
from memagent.rl.step import TrainRow, collate, micro_batches
from memagent.rollout.prompts import MemoryConfig
from memagent.rollout.workflow import run_memagent
from memagent.training.backend import warmup_constant
from memagent.training.demo_task import OracleLLM
from memagent.training.logging import progress


def oracle_rows(samples: list[Sample], tokenizer: PreTrainedTokenizerBase, memory: MemoryConfig) -> list[list[TrainRow]]:
    """Per question, its oracle conversations as rows (advantage unused)."""
    oracle = OracleLLM(tokenizer, samples, memory.initial_memory)
    out = []
    for traj in run_memagent(samples, oracle, memory, group_size=1):
        out.append([TrainRow(input_ids=c.prompt_ids + c.response_ids, prompt_len=len(c.prompt_ids),
                             response_mask=list(c.response_mask), advantage=0.0) for c in traj.conversations])
    return out


def warm_start(model: nn.Module, tokenizer: PreTrainedTokenizerBase, samples: list[Sample], memory: MemoryConfig,
               cfg: WarmStartConfig, *, seed: int, device: torch.device, budget: int, show: bool) -> list[float]:
    """`cfg.steps` AdamW updates of SFT on oracle traces of `samples`; returns the loss of each update."""
    traces = oracle_rows(samples, tokenizer, memory)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_constant(max(1, cfg.steps // 10)))
    rng = random.Random(seed)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    model.train()
    losses = []
    for _ in progress(range(cfg.steps), desc="warm start", enabled=show):
        rows = [r for q in rng.sample(range(len(traces)), min(cfg.batch_questions, len(traces))) for r in traces[q]]
        num_tokens = sum(r.num_trained_tokens for r in rows)
        total = 0.0
        for pack in micro_batches(rows, budget):
            mb = collate(pack, pad, device)
            logp = token_logprobs(model, mb.input_ids, mb.attention_mask, target_mask=mb.loss_mask).logprobs
            loss = -torch.where(mb.loss_mask, logp, 0.0).sum() / num_tokens  # token mean over the whole batch
            loss.backward()
            total += float(loss.detach())
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        losses.append(total)
    return losses
