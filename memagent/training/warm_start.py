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
    oracle = OracleLLM(tokenizer)
    out = []
    for traj in run_memagent(samples, oracle, memory, group_size=1):
        out.append([TrainRow(input_ids=c.prompt_ids + c.response_ids, prompt_len=len(c.prompt_ids),
                             response_mask=list(c.response_mask), advantage=0.0) for c in traj.conversations])
    return out


def copy_pretrain(model: nn.Module, vocab: list[int], cfg: WarmStartConfig, *, seed: int, device: torch.device,
                  show: bool) -> list[float]:
    """`cfg.copy_steps` AdamW updates of next-token loss on the second half of random token sequences repeated
    twice ("x1..xL x1..xL", L in 8..24, over `vocab`); returns the loss of each update.

    Why: SFT on oracle traces alone never taught the random tiny model to copy a value from the section (loss
    flat at ~0.95 nats/token for 200 updates); this dense copying signal forms induction heads first (the loss
    falls from ~3.5 to ~0.5 after about 1000 updates), after which the same SFT learns to read and keep.
    """
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.copy_lr, weight_decay=0.0)
    table = torch.tensor(vocab)
    model.train()
    losses = []
    for _ in progress(range(cfg.copy_steps), desc="copy pretrain", enabled=show):
        n = int(torch.randint(8, 25, (1,), generator=gen))
        x = table[torch.randint(len(vocab), (cfg.copy_batch, n), generator=gen)].to(device)
        ids = torch.cat([x, x], dim=1)
        logits = model(input_ids=ids).logits[:, n - 1 : -1].float()
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), x.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    return losses


def warm_start(model: nn.Module, tokenizer: PreTrainedTokenizerBase, samples: list[Sample], memory: MemoryConfig,
               cfg: WarmStartConfig, *, seed: int, device: torch.device, budget: int, show: bool) -> list[float]:
    """`cfg.steps` AdamW updates of SFT on oracle traces of `samples`; returns the loss of each update.

    Update u trains on questions u*B .. (u+1)*B-1 (B = cfg.batch_questions, wrapping around), so with
    steps * B fresh questions (train.py's `Run.warm`) no question is seen twice: repeating a few thousand
    questions for several epochs let the tiny model memorize them (training loss 0.01 nats/token, held-out 2.2).
    """
    traces = oracle_rows(samples, tokenizer, memory)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_constant(max(1, cfg.steps // 10)))
    order = list(range(len(traces)))
    random.Random(seed).shuffle(order)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    model.train()
    losses = []
    b = min(cfg.batch_questions, len(traces))
    for u in progress(range(cfg.steps), desc="warm start", enabled=show):
        rows = [r for i in range(u * b, (u + 1) * b) for r in traces[order[i % len(order)]]]
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
