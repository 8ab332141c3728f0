"""Clipped surrogate: docs/rl-math.md §6 properties 9-13 (piecewise value, zero-gradient regions, bounds, TRL delta,
metrics)."""

from __future__ import annotations

import math

import torch
from hypothesis import given
from hypothesis import strategies as st

from memagent.rl import clipped_token_loss, policy_loss

from .batches import FAST, batches, clip_cs, grad_of, modes, norm_len_for, token_weights

ratios = st.floats(1e-3, 30.0)
advs = st.floats(-5.0, 5.0)
clip_sides = st.floats(0.0, 0.9)


def _piecewise(rho: float, a: float, lo: float, hi: float, c: float | None) -> float:
    if a > 0:
        return -a * min(rho, 1 + hi)
    if a < 0:
        return abs(a) * min(max(rho, 1 - lo), math.inf if c is None else c)
    return 0.0


@FAST
@given(st.lists(st.tuples(ratios, advs), min_size=1, max_size=16), clip_sides, clip_sides, clip_cs)
def test_token_loss_matches_piecewise_form(pairs, lo, hi, c):
    rho = torch.tensor([p[0] for p in pairs], dtype=torch.float64)
    a = torch.tensor([p[1] for p in pairs], dtype=torch.float64)
    got = clipped_token_loss(rho, a, clip_low=lo, clip_high=hi, clip_c=c)
    expected = torch.tensor([_piecewise(r, x, lo, hi, c) for r, x in pairs], dtype=torch.float64)
    assert torch.allclose(got, expected, rtol=1e-12, atol=1e-12)


@FAST
@given(st.floats(0.01, 5.0), clip_sides, clip_sides, clip_cs)
def test_token_loss_monotone_in_ratio(a, lo, hi, c):
    rho = torch.linspace(0.01, 15.0, 400, dtype=torch.float64)
    pos = clipped_token_loss(rho, torch.full_like(rho, a), clip_low=lo, clip_high=hi, clip_c=c)
    neg = clipped_token_loss(rho, torch.full_like(rho, -a), clip_low=lo, clip_high=hi, clip_c=c)
    assert bool((pos[1:] <= pos[:-1]).all()), "A > 0: non-increasing in rho"
    assert bool((neg[1:] >= neg[:-1]).all()), "A < 0: non-decreasing in rho"


@FAST
@given(batches(spread=3.0), modes, clip_cs)
def test_gradient_zero_in_clipped_regions_and_minus_weight_a_rho_elsewhere(batch, agg, clip_c):
    logp = batch.logp.clone().requires_grad_(True)
    loss, _ = policy_loss(logp, batch.old_logp, batch.adv, batch.mask, clip_c=clip_c, agg=agg,
                          norm_len=norm_len_for(agg))
    a = batch.adv_tokens()
    rho = torch.exp(batch.logp - batch.old_logp)
    clipped = (a > 0) & (rho > 1.28) | (a < 0) & (rho < 0.8)
    if clip_c is not None:
        clipped |= (a < 0) & (rho > clip_c)
    w = token_weights(batch.mask, agg, norm_len_for(agg))
    expected = torch.where(clipped, torch.zeros_like(rho), -w * a * rho)
    grad = grad_of(loss, logp)
    assert torch.allclose(grad, expected, rtol=1e-12, atol=1e-15)
    assert bool((grad[clipped] == 0).all())


@FAST
@given(batches(spread=3.0), modes)
def test_zero_advantage_gives_zero_gradient(batch, agg):
    logp = batch.logp.clone().requires_grad_(True)
    loss, _ = policy_loss(logp, batch.old_logp, torch.zeros_like(batch.adv), batch.mask, agg=agg,
                          norm_len=norm_len_for(agg))
    assert loss == 0 and bool((grad_of(loss, logp) == 0).all())


@FAST
@given(st.lists(st.tuples(ratios, advs), min_size=1, max_size=16), clip_sides, clip_sides, st.floats(1.01, 20.0))
def test_loss_bounds_pessimism_and_dual_clip_cap(pairs, lo, hi, c):
    rho = torch.tensor([p[0] for p in pairs], dtype=torch.float64)
    a = torch.tensor([p[1] for p in pairs], dtype=torch.float64)
    no_dual = clipped_token_loss(rho, a, clip_low=lo, clip_high=hi, clip_c=None)
    assert bool((no_dual >= -a * rho - 1e-12).all()), "without dual clip the loss is pessimistic"
    dual = clipped_token_loss(rho, a, clip_low=lo, clip_high=hi, clip_c=c)
    assert bool((dual[a < 0] <= c * a[a < 0].abs() + 1e-12).all()), "with dual clip, L <= c |A| when A < 0"
    assert torch.equal(dual[a >= 0], no_dual[a >= 0]), "the dual clip never touches A >= 0"


@FAST
@given(batches(spread=3.0), modes, st.sampled_from([None, math.inf]))
def test_infinite_clips_reduce_to_plain_surrogate(batch, agg, clip_c):
    logp = batch.logp.clone().requires_grad_(True)
    kw = dict(agg=agg, norm_len=norm_len_for(agg))
    loss, _ = policy_loss(logp, batch.old_logp, batch.adv, batch.mask, clip_low=math.inf, clip_high=math.inf,
                          clip_c=clip_c, **kw)
    w = token_weights(batch.mask, agg, norm_len_for(agg))
    rho = torch.exp(logp - batch.old_logp)
    plain = (w * -batch.adv_tokens() * rho).sum()
    assert torch.allclose(loss, plain, rtol=1e-12)
    assert torch.allclose(grad_of(loss, logp), grad_of(plain, logp), rtol=1e-12, atol=1e-15)


def _trl_token_loss(logp, old_logp, adv, lo, hi, delta):
    """TRL GRPOTrainer (two-sided INTELLECT-2 clip): -min(min(rho, delta) A, clip(rho) A), written out here."""
    coef_1 = torch.exp(logp - old_logp)
    coef_2 = torch.clamp(coef_1, 1 - lo, 1 + hi)
    coef_1 = torch.clamp(coef_1, max=delta)
    return -torch.min(coef_1 * adv, coef_2 * adv)


@FAST
@given(batches(spread=3.0, per_token_adv=True), st.floats(1.3, 12.0))
def test_trl_delta_equals_dual_clip(batch, delta):
    logp = batch.logp.clone().requires_grad_(True)
    ours, _ = policy_loss(logp, batch.old_logp, batch.adv, batch.mask, clip_c=delta)
    trl_tok = _trl_token_loss(logp, batch.old_logp, batch.adv, 0.2, 0.28, delta)
    trl = (trl_tok * batch.mask).sum() / batch.mask.sum()
    assert torch.allclose(ours, trl, rtol=1e-12, atol=1e-15)
    assert torch.allclose(grad_of(ours, logp), grad_of(trl, logp), rtol=1e-12, atol=1e-15)


@FAST
@given(batches(spread=3.0), clip_cs)
def test_metrics_are_masked_means_of_their_indicators(batch, clip_c):
    _, m = policy_loss(batch.logp, batch.old_logp, batch.adv, batch.mask, clip_c=clip_c)
    valid = batch.mask != 0
    a, lr = batch.adv_tokens()[valid], (batch.logp - batch.old_logp)[valid]
    rho = lr.exp()
    clipped = ((a > 0) & (rho > 1.28)) | ((a < 0) & (rho < 0.8))
    lower = (a < 0) & (rho > clip_c) if clip_c is not None else torch.zeros_like(clipped)
    assert math.isclose(float(m.clipfrac), clipped.double().mean().item(), abs_tol=1e-12)
    assert math.isclose(float(m.clipfrac_lower), lower.double().mean().item(), abs_tol=1e-12)
    assert math.isclose(float(m.approx_kl), (-lr).mean().item(), rel_tol=1e-12, abs_tol=1e-15)
    assert math.isclose(float(m.ratio_mean), rho.mean().item(), rel_tol=1e-12)
    assert int(m.num_valid_tokens) == int(valid.sum())
    assert 0 <= m.clipfrac <= 1 and 0 <= m.clipfrac_lower <= 1
    d = m.as_dict()
    assert set(d) >= {"clipfrac", "clipfrac_lower", "approx_kl", "ratio_mean"}
    assert all(isinstance(v, float) for v in d.values())
    assert not any(getattr(m, k).requires_grad for k in d)
