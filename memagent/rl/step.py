"""The optimizer update of Multi-Conv DAPO: conversations -> micro-batches -> one exact global loss.

Each conversation of each trajectory is one training row (prompt + response, loss on the sampled response tokens).
The loss of one optimizer update is DAPO's token mean over ALL rows of the mini-batch on ALL data-parallel ranks:

    L = sum_{rows, t} m_t * l_t / N,        N = sum over ranks of the mini-batch's valid tokens (docs/rl-math.md §3)

N (num_tokens; num_seqs for the seq-* modes) is counted and all-reduced (SUM) BEFORE the micro-batch loop, each
micro-batch backpropagates its own sum divided by the global N, and each rank multiplies by the world size W to
cancel the 1/W of DDP / DeepSpeed gradient averaging. Any micro-batch token budget and any rank count therefore
give the same gradient. Ranks run the same number of micro-batches (empty ones where they have fewer rows), since
ZeRO-3 forward passes and DDP's synced backward are collectives.

What this file leaves out: the math (memagent.rl.loss / kl), and how gradients are reduced and applied (the
callables come from a `Learner`, memagent.training.learner).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from memagent.model.logprobs import TokenLogprobs, token_logprobs
from memagent.model.shared_prefix import shared_prefix_logprobs
from memagent.progress import progress
from memagent.records import TrainRow
from memagent.rl.kl import kl_penalty
from memagent.rl.loss import aggregate, policy_loss
from memagent.rl.packing import (  # noqa: F401 (pack_by_token_budget: re-exported)
    pack_by_length,
    pack_by_shared_prefix,
    pack_by_token_budget,
)


@dataclass
class MicroBatch:
    """Right-padded tensors of a few rows. Position t of the *_logp tensors is log p(ids[t] | ids[<t])."""

    input_ids: Tensor
    """[B, T] long."""
    attention_mask: Tensor
    """[B, T] long, 1 for real tokens."""
    loss_mask: Tensor
    """[B, T] bool, True on sampled response tokens."""
    advantages: Tensor
    """[B] float32."""
    old_logp: Tensor | None
    """[B, T] float32 (0 off the loss mask), or None when no row has old log-probs: the update's first mini-batch,
    whose forward runs under the weights that sampled, is its own old policy (update_policy)."""
    ref_logp: Tensor | None
    """[B, T] float32 or None."""
    prefix_ids: Tensor | None = None
    """[P] long prompt tokens every row starts with, run once (memagent.model.shared_prefix); the tensors above
    then hold each row's tokens after them. None: they hold whole rows."""


def collate(rows: list[TrainRow], pad_id: int, device: torch.device, prefix_len: int = 0) -> MicroBatch:
    """Right-pad rows into one MicroBatch; an empty list gives a two-token all-masked dummy row (with zero old and
    reference log-probs, so a KL run's dummy micro-batch collates like a real one). prefix_len > 0: the rows'
    first prefix_len tokens (prompt tokens they all share) become `prefix_ids` and are cut from every row."""
    if not rows:
        zero = torch.zeros(1)
        rows = [TrainRow(input_ids=[pad_id, pad_id], prompt_len=1, response_mask=[0], advantage=0.0,
                         old_logprobs=zero, ref_logprobs=zero)]
    T = max(len(r.input_ids) for r in rows) - prefix_len
    B = len(rows)
    ids = torch.full((B, T), pad_id, dtype=torch.long)
    attn = torch.zeros(B, T, dtype=torch.long)
    loss_mask = torch.zeros(B, T, dtype=torch.bool)
    has_old = [r.old_logprobs is not None for r in rows]
    if any(has_old) and not all(has_old):
        raise ValueError("collate: some rows of the micro-batch have old log-probs and some do not")
    old = torch.zeros(B, T) if all(has_old) else None
    ref = torch.zeros(B, T) if all(r.ref_logprobs is not None for r in rows) else None
    for i, r in enumerate(rows):
        n, p = len(r.input_ids) - prefix_len, r.prompt_len - prefix_len
        ids[i, :n] = torch.tensor(r.input_ids[prefix_len:])
        attn[i, :n] = 1
        loss_mask[i, p:n] = torch.tensor(r.response_mask, dtype=torch.bool)
        if old is not None:
            old[i, p:n] = r.old_logprobs
        if ref is not None and r.ref_logprobs is not None:
            ref[i, p:n] = r.ref_logprobs
    adv = torch.tensor([r.advantage for r in rows], dtype=torch.float32)
    to = dict(device=device)
    prefix = torch.tensor(rows[0].input_ids[:prefix_len], dtype=torch.long, device=device) if prefix_len else None
    return MicroBatch(ids.to(**to), attn.to(**to), loss_mask.to(**to), adv.to(**to),
                      None if old is None else old.to(**to), None if ref is None else ref.to(**to), prefix)


def micro_batches(rows: list[TrainRow], budget: int, count: int | None = None) -> list[list[TrainRow]]:
    """Rows packed by token budget, similar lengths together (packing.pack_by_length: any grouping gives the same
    loss, docs/rl-math.md §3), padded with empty micro-batches up to `count` (the max over ranks)."""
    packs = [[rows[i] for i in g] for g in pack_by_length([len(r.input_ids) for r in rows], budget)]
    return packs + [[] for _ in range(max(0, (count or 0) - len(packs)))]


def prefix_micro_batches(rows: list[TrainRow], budget: int, count: int | None = None, *,
                         shared_prefix: int = 0) -> list[tuple[list[TrainRow], int]]:
    """`micro_batches` with each pack's shared prefix length: rows whose prompts share at least `shared_prefix`
    leading tokens run them once per micro-batch (packing.pack_by_shared_prefix); 0 = off, every prefix 0.
    Any grouping still gives the same loss. Returns (rows, prefix length) per micro-batch, padded with empty
    plain ones up to `count`."""
    if shared_prefix <= 0:
        return [(pack, 0) for pack in micro_batches(rows, budget, count)]
    plan = pack_by_shared_prefix([r.input_ids[: r.prompt_len] for r in rows], [len(r.input_ids) for r in rows],
                                 budget, shared_prefix)
    packs = [([rows[i] for i in group], prefix) for group, prefix in plan]
    return packs + [([], 0) for _ in range(max(0, (count or 0) - len(packs)))]


def micro_batch_logprobs(model: nn.Module, mb: MicroBatch, *, temperature: float, with_entropy: bool = False,
                         target_mask: Tensor | None = None) -> TokenLogprobs:
    """[B, T] log-probs of a micro-batch: `token_logprobs` over whole rows, or, when it has a shared prefix,
    `shared_prefix_logprobs` over the rows' suffixes (equal up to float rounding)."""
    if mb.prefix_ids is None:
        return token_logprobs(model, mb.input_ids, mb.attention_mask, temperature=temperature,
                              with_entropy=with_entropy, target_mask=target_mask)
    return shared_prefix_logprobs(model, mb.prefix_ids, mb.input_ids, mb.attention_mask, temperature=temperature,
                                  with_entropy=with_entropy, target_mask=target_mask)


@torch.no_grad()
def response_logprobs(
    model: nn.Module, rows: list[TrainRow], *, budget: int, pad_id: int, temperature: float, device: torch.device,
    num_micro: int | None = None, shared_prefix: int = 0,
) -> list[Tensor]:
    """Per-row [response length] float32 log-probs under `model` (no grad): the old policy or the reference."""
    by_row: dict[int, Tensor] = {}  # id(row) -> its log-probs: micro-batches hold rows out of input order
    for pack, prefix in prefix_micro_batches(rows, budget, num_micro, shared_prefix=shared_prefix):
        mb = collate(pack, pad_id, device, prefix)
        logp = micro_batch_logprobs(model, mb, temperature=temperature, target_mask=mb.loss_mask).logprobs
        logp = logp.float().cpu()
        by_row.update((id(r), logp[i, r.prompt_len - prefix : len(r.input_ids) - prefix]) for i, r in enumerate(pack))
    return [by_row[id(r)] for r in rows]


def micro_batch_counts(minis: list[list[TrainRow]], budget: int,
                       all_reduce_max: Callable[[Tensor], Tensor], shared_prefix: int = 0) -> list[int]:
    """Micro-batches of each mini-batch, the max over ranks (one all-reduce): every rank runs as many forwards."""
    local = torch.tensor([len(prefix_micro_batches(mini, budget, shared_prefix=shared_prefix)) for mini in minis],
                         dtype=torch.long)
    return [int(n) for n in all_reduce_max(local)]


@torch.no_grad()
def set_logprobs(
    model: nn.Module, minis: list[list[TrainRow]], counts: list[int], field: str, *, budget: int, pad_id: int,
    temperature: float, device: torch.device, shared_prefix: int = 0,
) -> None:
    """Store `model`'s log-probs in each row's `field` ("old_logprobs" or "ref_logprobs"), mini-batch by mini-batch.

    Each mini-batch is packed exactly as accumulate_gradients packs it (same rows, same budget, `counts` from
    micro_batch_counts), so the update's forward sees the same tensors: before the first update the ratio is
    exactly 1, not 1 up to the float noise of a different padding.
    """
    for mini, count in zip(minis, counts):
        for row, lp in zip(mini, response_logprobs(model, mini, budget=budget, pad_id=pad_id, temperature=temperature,
                                                   device=device, num_micro=count, shared_prefix=shared_prefix)):
            setattr(row, field, lp)


def global_counts(rows: list[TrainRow], all_reduce_sum: Callable[[Tensor], Tensor]) -> tuple[float, float]:
    """(num_tokens, num_seqs) of the mini-batch over all ranks: valid tokens, and rows with at least one."""
    local = torch.tensor([sum(r.num_trained_tokens for r in rows), sum(r.num_trained_tokens > 0 for r in rows)],
                         dtype=torch.float64)
    total = all_reduce_sum(local)
    return float(total[0]), float(total[1])


def accumulate_gradients(
    model: nn.Module,
    rows: list[TrainRow],
    *,
    clip_low: float,
    clip_high: float,
    clip_c: float | None,
    agg: str,
    norm_len: float | None,
    kl_coef: float,
    kl_kind: str,
    num_tokens: float,
    num_seqs: float,
    world_size: int,
    budget: int,
    pad_id: int,
    temperature: float,
    device: torch.device,
    backward: Callable[[Tensor, bool], None],
    num_micro: int | None = None,
    shared_prefix: int = 0,
) -> dict[str, float]:
    """Forward/backward every micro-batch of `rows`; gradients accumulate, nothing is stepped.

    clip_low ... kl_kind: the loss settings of memagent.rl.loss.policy_loss and memagent.rl.kl.kl_penalty (kl_coef 0 =
    no KL term). `backward(loss, is_last)` is the learner's (DDP no_sync / DeepSpeed boundary on the last one). Returns the
    step's metrics: "loss" (this rank's share of the global loss, times W), token-weighted "clipfrac",
    "clipfrac_lower", "approx_kl", "entropy", and "kl" when a reference is used.
    """
    if num_tokens <= 0 or num_seqs <= 0:
        raise ValueError("accumulate_gradients: the mini-batch has no trained token on any rank")
    packs = prefix_micro_batches(rows, budget, num_micro, shared_prefix=shared_prefix)
    sums = {"loss": 0.0, "clipfrac": 0.0, "clipfrac_lower": 0.0, "approx_kl": 0.0, "entropy": 0.0, "kl": 0.0}
    tokens = 0
    for k, (pack, prefix) in enumerate(packs):
        mb = collate(pack, pad_id, device, prefix)
        # An all-masked (dummy) micro-batch still computes one position, so its zero loss has a graph: the
        # backward it runs is the collective the other ranks wait for.
        target = mb.loss_mask if bool(mb.loss_mask.any()) else None
        out = micro_batch_logprobs(model, mb, temperature=temperature, with_entropy=True, target_mask=target)
        # No old log-probs: this forward runs under the weights that sampled (update_policy's first mini-batch), so
        # its own values are the old policy's, the ones a separate no-grad pass would recompute bit for bit.
        old_logp = out.logprobs.detach() if mb.old_logp is None else mb.old_logp
        loss, metrics = policy_loss(out.logprobs, old_logp, mb.advantages, mb.loss_mask, clip_low=clip_low,
                                    clip_high=clip_high, clip_c=clip_c, agg=agg, num_tokens=num_tokens,
                                    num_seqs=num_seqs, norm_len=norm_len)
        n = int(mb.loss_mask.sum())
        if kl_coef > 0:
            if mb.ref_logp is None:
                raise ValueError("kl_coef > 0 needs reference log-probs on every row")
            kl = kl_penalty(out.logprobs, mb.ref_logp, kind=kl_kind)  # [B, T] per token
            loss = loss + kl_coef * aggregate(kl, mb.loss_mask, agg=agg, num_tokens=num_tokens, num_seqs=num_seqs,
                                              norm_len=norm_len)
            sums["kl"] += float(torch.where(mb.loss_mask, kl.detach(), 0.0).sum())
        # x W: DDP and DeepSpeed average gradients over ranks; the global normalizer already divides by all tokens.
        backward(loss * world_size, k == len(packs) - 1)
        sums["loss"] += float(loss.detach())
        for key in ("clipfrac", "clipfrac_lower", "approx_kl"):
            sums[key] += float(getattr(metrics, key)) * n
        sums["entropy"] += float(torch.where(mb.loss_mask, out.entropy.detach(), 0.0).sum())
        tokens += n
    result = {"loss": sums["loss"] * world_size}
    for key in ("clipfrac", "clipfrac_lower", "approx_kl", "entropy", "kl"):
        result[key] = sums[key] / max(tokens, 1)
    result["tokens"] = float(tokens)
    return result


def split_mini_batches(rows: list[TrainRow], n: int) -> list[list[TrainRow]]:
    """`n` contiguous, near-equal slices of the rows (MemAgent: train_batch_size // ppo_mini_batch_size updates)."""
    size, extra = divmod(len(rows), n)
    out, start = [], 0
    for i in range(n):
        end = start + size + (1 if i < extra else 0)
        out.append(rows[start:end])
        start = end
    return out


def update_policy(
    model: nn.Module, minis: list[list[TrainRow]], counts: list[int], *, clip_low: float, clip_high: float,
    clip_c: float | None, agg: str, norm_len: float | None, kl_coef: float, kl_kind: str, world_size: int,
    budget: int, pad_id: int, temperature: float, device: torch.device,
    all_reduce_sum: Callable[[Tensor], Tensor], backward: Callable[[Tensor, bool], None],
    optimizer_step: Callable[[], tuple[float, bool]], show_progress: bool = False,
    forward_context: Callable[[], AbstractContextManager] = nullcontext, shared_prefix: int = 0,
) -> list[dict[str, float]]:
    """Step 6: one optimizer update per mini-batch (`counts[i]` micro-batches each, from micro_batch_counts).

    For each mini-batch: count its trained tokens over all ranks BEFORE the micro-batch loop (the global normalizer,
    docs/rl-math.md §3), accumulate every micro-batch's gradient, then `optimizer_step()` -> (grad norm, skipped).
    A mini-batch with no trained token on any rank is skipped by every rank alike. Returns each update's metrics
    (accumulate_gradients' plus "grad_norm" and "skipped").

    forward_context() (bf16 autocast, memagent.model.precision.autocast) is entered around each update's forward and
    backward passes and left before its optimizer step. It must not be open around this call: autocast keeps its
    bf16 copy of each fp32 weight until the outermost context exits, so under one context every update after the
    first would run on copies of the weights from before the first, so an open one is refused.

    shared_prefix: rows whose prompts share at least this many leading tokens run them once per micro-batch
    (memagent.model.shared_prefix: one process, no gradient checkpointing); 0 = off. The gradient is the same up to
    float rounding; set_logprobs must be given the same value, so the first ratio stays exactly 1.

    Old log-probs: every mini-batch after the first needs them on its rows (set_logprobs, or the sampler's), since
    the weights have moved by then. The first may go without: its update is the first since the rollout, so its
    forward's own log-probs, detached, are the old policy's (ratio exactly 1, as with a recomputation packed the
    same way), and step 5 need not run a no-grad pass for it.
    """
    if torch.is_autocast_enabled(device.type):
        raise RuntimeError("update_policy: called inside an autocast context, which would serve every update after "
                           "the first stale bf16 copies of the weights; pass forward_context=lambda: autocast(...) "
                           "instead")
    for i, mini in enumerate(minis[1:], start=1):
        if any(r.old_logprobs is None for r in mini):
            raise ValueError(f"update_policy: mini-batch {i} has rows without old log-probs; only the first update "
                             "runs under the weights that sampled (set_logprobs the others)")
    updates: list[dict[str, float]] = []
    for mini, num_micro in progress(list(zip(minis, counts)), desc="update", enabled=show_progress):
        num_tokens, num_seqs = global_counts(mini, all_reduce_sum)
        if num_tokens == 0:
            continue
        with forward_context():
            metrics = accumulate_gradients(
                model, mini, clip_low=clip_low, clip_high=clip_high, clip_c=clip_c, agg=agg, norm_len=norm_len,
                kl_coef=kl_coef, kl_kind=kl_kind, num_tokens=num_tokens, num_seqs=num_seqs, world_size=world_size,
                budget=budget, pad_id=pad_id, temperature=temperature, device=device, backward=backward,
                num_micro=num_micro, shared_prefix=shared_prefix)
        grad_norm, skipped = optimizer_step()
        metrics["grad_norm"], metrics["skipped"] = grad_norm, float(skipped)
        updates.append(metrics)
    return updates
