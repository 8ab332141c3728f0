"""On-policy gradient and the role of A: docs/rl-math.md §6 properties 8 and 14 (and 13's on-policy zeros)."""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st

from memagent.rl import policy_loss

from .batches import FAST, batches, clip_cs, grad_of, modes, norm_len_for, token_weights


@FAST
@given(batches(on_policy=True), modes, clip_cs)
def test_onpolicy_gradient_is_minus_weight_times_advantage(batch, agg, clip_c):
    logp = batch.logp.clone().requires_grad_(True)
    loss, _ = policy_loss(logp, logp.detach(), batch.adv, batch.mask, clip_c=clip_c, agg=agg,
                          norm_len=norm_len_for(agg))
    w = token_weights(batch.mask, agg, norm_len_for(agg))
    assert torch.allclose(grad_of(loss, logp), -w * batch.adv_tokens(), rtol=1e-12, atol=1e-15)


@FAST
@given(batches(on_policy=True), modes)
def test_onpolicy_loss_is_minus_weighted_advantage_sum(batch, agg):
    loss, _ = policy_loss(batch.logp, batch.logp, batch.adv, batch.mask, agg=agg, norm_len=norm_len_for(agg))
    w = token_weights(batch.mask, agg, norm_len_for(agg))
    assert torch.allclose(loss, -(w * batch.adv_tokens()).sum(), rtol=1e-12, atol=1e-15)


@FAST
@given(batches(on_policy=True))
def test_onpolicy_metrics_show_no_clipping_and_zero_kl(batch):
    _, m = policy_loss(batch.logp, batch.logp, batch.adv, batch.mask, clip_c=3.0)
    assert m.clipfrac == 0 and m.clipfrac_lower == 0 and m.approx_kl == 0 and m.ratio_mean == 1


@FAST
@given(batches(), modes, clip_cs)
def test_negating_advantage_flips_onpolicy_gradient(batch, agg, clip_c):
    logp = batch.logp.clone().requires_grad_(True)
    kw = dict(clip_c=clip_c, agg=agg, norm_len=norm_len_for(agg))
    g_pos = grad_of(policy_loss(logp, logp.detach(), batch.adv, batch.mask, **kw)[0], logp)
    g_neg = grad_of(policy_loss(logp, logp.detach(), -batch.adv, batch.mask, **kw)[0], logp)
    assert torch.allclose(g_neg, -g_pos, rtol=1e-12, atol=1e-15)


@FAST
@given(batches(spread=2.5), modes, clip_cs, st.floats(1e-3, 1e3))
def test_scaling_advantage_scales_gradient_and_keeps_clipped_set(batch, agg, clip_c, c):
    # Off-policy on purpose: every clip threshold depends on sign(A) and rho only, so L(cA) = c L(A) for c > 0.
    logp = batch.logp.clone().requires_grad_(True)
    kw = dict(clip_c=clip_c, agg=agg, norm_len=norm_len_for(agg))
    loss1, m1 = policy_loss(logp, batch.old_logp, batch.adv, batch.mask, **kw)
    loss_c, m_c = policy_loss(logp, batch.old_logp, c * batch.adv, batch.mask, **kw)
    assert torch.allclose(loss_c, c * loss1, rtol=1e-10, atol=1e-14)
    assert torch.allclose(grad_of(loss_c, logp), c * grad_of(loss1, logp), rtol=1e-10, atol=1e-14)
    assert m1.clipfrac == m_c.clipfrac and m1.clipfrac_lower == m_c.clipfrac_lower
