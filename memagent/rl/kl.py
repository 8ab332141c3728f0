"""Per-token KL estimators between the policy and a frozen reference model (Schulman, "Approximating KL").

With delta = logp - ref_logp (log-probs of tokens sampled from the policy):
    k1 = delta                          unbiased for KL(pi || ref), high variance, zero-mean gradient
    k2 = delta^2 / 2                    biased value; its gradient is the gradient of KL(pi || ref)
    k3 = exp(-delta) - 1 + delta        unbiased, >= 0, low variance (verl "low_var_kl", TRL, OpenRLHF)
    k3+ = k3's value with k2's gradient (straight-through, verl "k3+"), since k3 as a loss has a biased gradient
DAPO uses no KL; MemAgent's released setting adds 0.001 * low_var_kl to the loss. Aggregate the result with
memagent.rl.aggregate and the same normalizer as the policy loss.
"""

from __future__ import annotations

import torch
from torch import Tensor

KL_KINDS = {"k1": "k1", "kl": "k1", "k2": "k2", "mse": "k2", "k3": "k3", "low_var_kl": "k3", "k3+": "k3+"}
"""Accepted `kind` names and the estimator each one means (verl's aliases included)."""
DELTA_CLAMP = 20.0
"""k3 clamps delta to [-20, 20] before exp, as verl does, so exp(-delta) cannot overflow."""
K3_CLAMP = 10.0
"""k3's value is capped at 10, as verl and OpenRLHF do ([-10, 10]), bounding one stale token's penalty."""


def _k3(delta: Tensor) -> Tensor:
    d = delta.clamp(-DELTA_CLAMP, DELTA_CLAMP)
    # expm1 keeps k3 ~ d^2/2 accurate for small d; k3 >= 0 exactly, so the lower bound 0 (verl uses -10) only
    # removes round-off below zero and never changes a true value.
    return (torch.expm1(-d) + d).clamp(0.0, K3_CLAMP)


def kl_penalty(logp: Tensor, ref_logp: Tensor, kind: str = "k3") -> Tensor:
    """Per-token KL estimate of pi_theta against the reference.

    Args:
        logp: [B, T] (any shape) float, policy log-probs of the sampled tokens (carries the gradient).
        ref_logp: same shape, reference log-probs (treated as constants).
        kind: "k1" / "kl", "k2" / "mse", "k3" / "low_var_kl", or "k3+".
    Returns:
        Same shape as logp: the per-token estimate; mask and aggregate it with the loss's normalizer.
    """
    if kind not in KL_KINDS:
        raise ValueError(f"kind: expected one of {sorted(KL_KINDS)}, got {kind!r}")
    if ref_logp.shape != logp.shape:
        raise ValueError(f"ref_logp: expected shape {tuple(logp.shape)} (as logp), got {tuple(ref_logp.shape)}")
    delta = logp - ref_logp.detach()
    estimator = KL_KINDS[kind]
    if estimator == "k1":
        return delta
    if estimator == "k2":
        return 0.5 * delta * delta
    if estimator == "k3":
        return _k3(delta)
    k2 = 0.5 * delta * delta
    return k2 + (_k3(delta) - k2).detach()
