"""Masking and aggregation: docs/rl-math.md §6 properties 15-17 (mask isolation, padding, mode identities)."""

from __future__ import annotations

import math

import torch
from hypothesis import given
from hypothesis import strategies as st

from memagent.rl import policy_loss

from .batches import FAST, Batch, batches, clip_cs, grad_of, modes, norm_len_for


def _loss_and_grad(batch: Batch, agg: str, clip_c: float | None = 10.0, norm_len: float | None = None):
    logp = batch.logp.clone().requires_grad_(True)
    loss, _ = policy_loss(logp, batch.old_logp, batch.adv, batch.mask, clip_c=clip_c, agg=agg,
                          norm_len=norm_len if norm_len is not None else norm_len_for(agg))
    return loss.detach(), grad_of(loss, logp)


@FAST
@given(batches(spread=2.0, per_token_adv=True), modes, clip_cs, st.sampled_from([math.nan, math.inf, -math.inf, 7.0]))
def test_masked_positions_change_neither_loss_nor_gradient(batch, agg, clip_c, junk):
    masked = batch.mask == 0
    dirty = Batch(
        batch.logp.masked_fill(masked, junk), batch.old_logp.masked_fill(masked, -junk),
        batch.adv.masked_fill(masked, junk), batch.mask,
    )
    loss, grad = _loss_and_grad(batch, agg, clip_c)
    dirty_loss, dirty_grad = _loss_and_grad(dirty, agg, clip_c)
    assert torch.equal(dirty_loss, loss) and torch.equal(dirty_grad, grad)
    assert bool((dirty_grad[masked] == 0).all())
    _, metrics = policy_loss(dirty.logp, dirty.old_logp, dirty.adv, dirty.mask, clip_c=clip_c)
    assert all(math.isfinite(v) for v in metrics.as_dict().values())


def _pad_columns(batch: Batch, extra: int) -> Batch:
    def pad(x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x, torch.randn(x.shape[0], extra, dtype=x.dtype)], dim=1)

    mask = torch.cat([batch.mask, torch.zeros(batch.mask.shape[0], extra, dtype=batch.mask.dtype)], dim=1)
    return Batch(pad(batch.logp), pad(batch.old_logp), pad(batch.adv) if batch.adv.dim() == 2 else batch.adv, mask)


@FAST
@given(batches(spread=2.0), modes, st.integers(1, 6))
def test_padding_columns_leave_loss_unchanged(batch, agg, extra):
    # For seq-mean-token-sum-norm this needs a constant norm_len (batches.NORM_LEN), not the padded width.
    padded = _pad_columns(batch, extra)
    loss, grad = _loss_and_grad(batch, agg)
    p_loss, p_grad = _loss_and_grad(padded, agg)
    assert torch.allclose(p_loss, loss, rtol=1e-12, atol=1e-15)
    assert torch.allclose(p_grad[:, : batch.logp.shape[1]], grad, rtol=1e-12, atol=1e-15)
    assert bool((p_grad[:, batch.logp.shape[1]:] == 0).all())


@FAST
@given(batches(spread=2.0), st.integers(1, 6))
def test_dr_grpo_changes_with_padding_when_norm_len_is_padded_width(batch, extra):
    # verl's old default L_c = mask.shape[-1] (issue #3741): the loss then depends on how much padding there is.
    padded = _pad_columns(batch, extra)
    loss, _ = _loss_and_grad(batch, "seq-mean-token-sum-norm", norm_len=batch.logp.shape[1])
    p_loss, _ = _loss_and_grad(padded, "seq-mean-token-sum-norm", norm_len=padded.logp.shape[1])
    assert torch.allclose(p_loss * padded.logp.shape[1], loss * batch.logp.shape[1], rtol=1e-12, atol=1e-15)
    if loss != 0:
        assert p_loss != loss


@FAST
@given(batches(spread=2.0), modes, st.integers(1, 3))
def test_fully_masked_rows_change_nothing(batch, agg, extra_rows):
    t = batch.logp.shape[1]
    junk = torch.randn(extra_rows, t, dtype=torch.float64)
    adv_junk = torch.randn((extra_rows,) + tuple(batch.adv.shape[1:]), dtype=torch.float64)
    grown = Batch(
        torch.cat([batch.logp, junk]), torch.cat([batch.old_logp, junk]), torch.cat([batch.adv, adv_junk]),
        torch.cat([batch.mask, torch.zeros(extra_rows, t, dtype=torch.float64)]),
    )
    loss, grad = _loss_and_grad(batch, agg)
    g_loss, g_grad = _loss_and_grad(grown, agg)
    assert torch.allclose(g_loss, loss, rtol=1e-12, atol=1e-15)
    assert torch.allclose(g_grad[: len(grad)], grad, rtol=1e-12, atol=1e-15)


@FAST
@given(batches(spread=2.0))
def test_equal_lengths_token_mean_equals_seq_mean_token_mean(batch):
    full = Batch(batch.logp, batch.old_logp, batch.adv, torch.ones_like(batch.mask))
    a, _ = _loss_and_grad(full, "token-mean")
    b, _ = _loss_and_grad(full, "seq-mean-token-mean")
    assert torch.allclose(a, b, rtol=1e-12, atol=1e-15)


@FAST
@given(batches(spread=2.0))
def test_seq_mean_token_sum_is_tokens_per_seq_times_token_mean(batch):
    n, b = batch.mask.sum(), batch.mask.shape[0]
    token_mean, _ = _loss_and_grad(batch, "token-mean")
    token_sum, _ = _loss_and_grad(batch, "seq-mean-token-sum")
    assert torch.allclose(token_sum, n / b * token_mean, rtol=1e-12, atol=1e-15)


@FAST
@given(batches(spread=2.0))
def test_token_mean_is_length_weighted_mean_of_sequence_means(batch):
    token_mean, _ = _loss_and_grad(batch, "token-mean")
    lengths = batch.mask.sum(-1)
    per_seq = torch.stack([
        _loss_and_grad(Batch(batch.logp[i:i + 1], batch.old_logp[i:i + 1], batch.adv[i:i + 1], batch.mask[i:i + 1]),
                       "token-mean")[0]
        for i in range(batch.mask.shape[0])
    ])
    assert torch.allclose(token_mean, (lengths * per_seq).sum() / lengths.sum(), rtol=1e-12, atol=1e-15)


@FAST
@given(batches(spread=2.0), modes, st.integers(0, 2**31 - 1))
def test_loss_invariant_to_row_permutation(batch, agg, seed):
    perm = torch.randperm(batch.mask.shape[0], generator=torch.Generator().manual_seed(seed))
    permuted = Batch(batch.logp[perm], batch.old_logp[perm], batch.adv[perm], batch.mask[perm])
    loss, grad = _loss_and_grad(batch, agg)
    p_loss, p_grad = _loss_and_grad(permuted, agg)
    assert torch.allclose(p_loss, loss, rtol=1e-12, atol=1e-15)
    assert torch.allclose(p_grad, grad[perm], rtol=1e-12, atol=1e-15)


@FAST
@given(batches(spread=2.0), modes)
def test_loss_invariant_to_batch_duplication(batch, agg):
    doubled = Batch(*(torch.cat([x, x]) for x in (batch.logp, batch.old_logp, batch.adv, batch.mask)))
    loss, _ = _loss_and_grad(batch, agg)
    d_loss, _ = _loss_and_grad(doubled, agg)
    assert torch.allclose(d_loss, loss, rtol=1e-12, atol=1e-15)
