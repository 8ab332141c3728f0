"""The vectorized policy_loss agrees with the slow loop reference (tests/rl/reference.py) in value and gradient."""

from __future__ import annotations

import math

import torch
from hypothesis import given
from hypothesis import strategies as st

from memagent.rl import policy_loss

from .batches import FAST, batches, clip_cs, grad_of, modes, norm_len_for
from .reference import ref_policy_loss


@FAST
@given(batches(spread=3.0), modes, clip_cs, st.sampled_from([(0.2, 0.28), (0.2, 0.2), (0.1, 0.5)]),
       st.booleans())
def test_policy_loss_matches_loop_reference(batch, agg, clip_c, clips, global_counts):
    lo, hi = clips
    counts = {}
    if global_counts:  # as if this call were one micro-batch of a larger step
        counts = dict(num_tokens=float(batch.mask.sum()) + 7.0, num_seqs=float(batch.mask.shape[0]) + 2.0)
    kw = dict(clip_low=lo, clip_high=hi, clip_c=clip_c, agg=agg, norm_len=norm_len_for(agg), **counts)
    logp = batch.logp.clone().requires_grad_(True)
    loss, _ = policy_loss(logp, batch.old_logp, batch.adv, batch.mask, **kw)
    ref_loss, ref_grad = ref_policy_loss(
        batch.logp.tolist(), batch.old_logp.tolist(), batch.adv_tokens().tolist(), batch.mask.tolist(), **kw
    )
    assert math.isclose(float(loss.detach()), ref_loss, rel_tol=1e-12, abs_tol=1e-14)
    assert torch.allclose(grad_of(loss, logp), torch.tensor(ref_grad, dtype=torch.float64), rtol=1e-12, atol=1e-14)


@FAST
@given(batches(max_rows=3, max_len=4, spread=30.0, per_token_adv=True), modes)
def test_policy_loss_matches_reference_beyond_log_ratio_clamp(batch, agg):
    # Log-ratios up to +-30: the [-20, 20] clamp freezes exp() and zeroes the gradient there, in both.
    kw = dict(clip_c=None, agg=agg, norm_len=norm_len_for(agg))
    logp = batch.logp.clone().requires_grad_(True)
    loss, _ = policy_loss(logp, batch.old_logp, batch.adv, batch.mask, **kw)
    ref_loss, ref_grad = ref_policy_loss(
        batch.logp.tolist(), batch.old_logp.tolist(), batch.adv.tolist(), batch.mask.tolist(),
        clip_low=0.2, clip_high=0.28, **kw,
    )
    assert math.isclose(float(loss.detach()), ref_loss, rel_tol=1e-12, abs_tol=1e-12)
    assert torch.allclose(grad_of(loss, logp), torch.tensor(ref_grad, dtype=torch.float64), rtol=1e-12, atol=1e-12)
