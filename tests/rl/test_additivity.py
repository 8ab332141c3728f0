"""Micro-batch and data-parallel additivity: docs/rl-math.md §6 properties 18 and 19.

A simulated optimizer step: the rows are split into micro-batches, the micro-batches are dealt to R ranks, each
rank backprops R * (its micro-batch losses, normalized by the GLOBAL counts), and DDP averages the rank gradients.
The result must equal the full-batch gradient for every aggregation mode.
"""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st

from memagent.rl import aggregate, entropy_from_logits, group_advantages, kl_penalty, policy_loss

from .batches import FAST, Batch, batches, clip_cs, grad_of, modes, norm_len_for


@st.composite
def step_layouts(draw: st.DrawFn, n_rows: int) -> list[list[list[int]]]:
    """Rows -> micro-batches -> ranks: layout[r] is rank r's list of micro-batches (lists of row indices)."""
    order = draw(st.permutations(range(n_rows)))
    cuts = sorted(draw(st.sets(st.integers(1, max(1, n_rows - 1)), max_size=n_rows - 1))) if n_rows > 1 else []
    micro = [list(order[a:b]) for a, b in zip([0, *cuts], [*cuts, n_rows])]
    ranks = draw(st.integers(1, 3))
    layout: list[list[list[int]]] = [[] for _ in range(ranks)]
    for mb in micro:
        layout[draw(st.integers(0, ranks - 1))].append(mb)
    return layout


def _trim(idx: list[int], mask: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Row index tensor and the micro-batch's own padded width (up to its last valid column)."""
    rows = torch.tensor(idx)
    cols = torch.nonzero(mask[rows].sum(0)).flatten()
    return rows, int(cols.max()) + 1 if cols.numel() else 1


def _simulated_step(layout, loss_of_micro_batch, leaf: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean over ranks of rank losses, mean over ranks of rank gradients), each rank backpropping R * its losses."""
    ranks = len(layout)
    losses, grads = [], []
    for micro_batches in layout:
        total = leaf.sum() * 0.0  # a rank with no data still joins the all-reduce with a zero gradient
        for idx in micro_batches:
            total = total + ranks * loss_of_micro_batch(idx)
        losses.append(total.detach())
        grads.append(grad_of(total, leaf))
    return torch.stack(losses).mean(), torch.stack(grads).mean(0)


@FAST
@given(st.data(), batches(max_rows=7, spread=2.0), modes, clip_cs)
def test_gradient_additive_over_microbatches_and_ranks(data, batch, agg, clip_c):
    layout = data.draw(step_layouts(batch.mask.shape[0]))
    logp = batch.logp.clone().requires_grad_(True)
    n_tok, n_seq = batch.mask.sum(), (batch.mask.sum(-1) > 0).sum()
    kw = dict(clip_c=clip_c, agg=agg, norm_len=norm_len_for(agg))

    def micro_loss(idx):
        rows, width = _trim(idx, batch.mask)
        adv = batch.adv[rows] if batch.adv.dim() == 1 else batch.adv[rows, :width]
        return policy_loss(logp[rows, :width], batch.old_logp[rows, :width], adv, batch.mask[rows, :width],
                           num_tokens=n_tok, num_seqs=n_seq, **kw)[0]

    full, _ = policy_loss(logp, batch.old_logp, batch.adv, batch.mask, **kw)
    step_loss, step_grad = _simulated_step(layout, micro_loss, logp)
    assert torch.allclose(step_loss, full.detach(), rtol=1e-10, atol=1e-14)
    assert torch.allclose(step_grad, grad_of(full, logp), rtol=1e-10, atol=1e-14)


@FAST
@given(st.data(), batches(max_rows=6, spread=1.0), modes)
def test_kl_and_entropy_terms_additive_over_microbatches_and_ranks(data, batch, agg):
    layout = data.draw(step_layouts(batch.mask.shape[0]))
    b, t = batch.mask.shape
    logits = torch.randn(b, t, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(b * 31 + t))
    logits.requires_grad_(True)
    ref = batch.old_logp
    n_tok, n_seq = batch.mask.sum(), (batch.mask.sum(-1) > 0).sum()
    kw = dict(agg=agg, norm_len=norm_len_for(agg))

    def terms(lg, ref_, mask, **counts):
        logp = torch.log_softmax(lg, -1)[..., 0]  # the "sampled" token's log-prob, differentiable in the logits
        kl = aggregate(kl_penalty(logp, ref_, "k3"), mask, **counts, **kw)
        ent = aggregate(entropy_from_logits(lg), mask, **counts, **kw)
        return 0.1 * kl - 0.01 * ent

    def micro_loss(idx):
        rows, width = _trim(idx, batch.mask)
        return terms(logits[rows, :width], ref[rows, :width], batch.mask[rows, :width], num_tokens=n_tok,
                     num_seqs=n_seq)

    full = terms(logits, ref, batch.mask)
    step_loss, step_grad = _simulated_step(layout, micro_loss, logits)
    assert torch.allclose(step_loss, full.detach(), rtol=1e-10, atol=1e-14)
    assert torch.allclose(step_grad, grad_of(full, logits), rtol=1e-10, atol=1e-14)


def test_per_microbatch_normalization_breaks_additivity():
    # Two rows of lengths 1 and 4, one micro-batch each, each normalized by its own token count and averaged over
    # the accumulation steps (verl legacy dp_actor, issue #5625): the short row is over-weighted 2.5x.
    mask = torch.tensor([[1.0, 0, 0, 0], [1, 1, 1, 1]], dtype=torch.float64)
    logp = torch.full((2, 4), -1.0, dtype=torch.float64, requires_grad=True)
    adv = torch.tensor([1.0, 1.0], dtype=torch.float64)
    full, _ = policy_loss(logp, logp.detach(), adv, mask)
    wrong = sum(policy_loss(logp[i:i + 1], logp.detach()[i:i + 1], adv[i:i + 1], mask[i:i + 1])[0] for i in (0, 1)) / 2
    right = sum(policy_loss(logp[i:i + 1], logp.detach()[i:i + 1], adv[i:i + 1], mask[i:i + 1], num_tokens=5)[0]
                for i in (0, 1))
    g_full, g_wrong, g_right = grad_of(full, logp), grad_of(wrong, logp), grad_of(right, logp)
    assert torch.allclose(g_right, g_full, rtol=1e-12)
    assert not torch.allclose(g_wrong, g_full)
    assert torch.isclose(g_wrong[0, 0] / g_full[0, 0], torch.tensor(2.5, dtype=torch.float64))


@FAST
@given(batches(min_rows=4, max_rows=8, on_policy=True, per_token_adv=False), st.integers(0, 2**31 - 1), modes)
def test_zero_variance_group_contributes_no_gradient_but_counts_in_normalizer(batch, seed, agg):
    rows = batch.mask.shape[0]
    g = torch.Generator().manual_seed(seed)
    group_ids = torch.arange(rows) % 2  # group 1 gets one constant reward, group 0 random ones
    rewards = torch.where(group_ids == 1, torch.tensor(0.7, dtype=torch.float64),
                          torch.rand(rows, generator=g, dtype=torch.float64))
    adv = group_advantages(rewards, group_ids)
    logp = batch.logp.clone().requires_grad_(True)
    kw = dict(agg=agg, norm_len=norm_len_for(agg))
    full, _ = policy_loss(logp, logp.detach(), adv, batch.mask, **kw)
    grad = grad_of(full, logp)
    constant = group_ids == 1
    assert bool((grad[constant] == 0).all())
    # The informative rows alone, with the full step's counts, give the same gradient; with their own counts they
    # do not (the constant group dilutes N and B, docs/rl-math.md §7): that dilution is what dynamic sampling removes.
    keep = ~constant
    sub = Batch(batch.logp[keep], batch.old_logp[keep], adv[keep], batch.mask[keep])
    n_tok, n_seq = batch.mask.sum(), float(rows)
    sub_logp = sub.logp.clone().requires_grad_(True)
    global_sub, _ = policy_loss(sub_logp, sub_logp.detach(), sub.adv, sub.mask, num_tokens=n_tok, num_seqs=n_seq, **kw)
    assert torch.allclose(grad_of(global_sub, sub_logp), grad[keep], rtol=1e-12, atol=1e-15)
    own_sub, _ = policy_loss(sub_logp, sub_logp.detach(), sub.adv, sub.mask, **kw)
    assert bool((grad[keep] != 0).any())
    assert not torch.allclose(grad_of(own_sub, sub_logp), grad[keep], rtol=1e-6, atol=0)
