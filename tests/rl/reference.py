"""Slow, obvious references: Python loops over the formulas of docs/rl-math.md §1-4, one row and one token at a time.

They use plain floats and `math`, no tensor ops and no autograd, so agreeing with them checks the vectorized
code (and its autograd gradient) against an independent derivation: the gradient here is written by hand as
dL/dlogp = -A rho inside the active region of the clip and 0 outside it.
"""

from __future__ import annotations

import math


def ref_group_advantages(rewards: list[float], group_ids: list[int], scale_by_std: bool, eps: float) -> list[float]:
    """A_i = (R_i - mean_g) / (std_g + eps) with unbiased std; 0 for constant or size-1 groups."""
    out = []
    for r, g in zip(rewards, group_ids):
        members = [x for x, h in zip(rewards, group_ids) if h == g]
        if max(members) == min(members):
            out.append(0.0)
            continue
        mean = sum(members) / len(members)
        std = math.sqrt(sum((x - mean) ** 2 for x in members) / (len(members) - 1))
        out.append((r - mean) / (std + eps) if scale_by_std else r - mean)
    return out


def ref_token_loss(rho: float, a: float, clip_low: float, clip_high: float, clip_c: float | None) -> float:
    """max(-A rho, -A clip(rho)), then min(., c |A|) when A < 0."""
    clipped_rho = min(max(rho, 1.0 - clip_low), 1.0 + clip_high)
    loss = max(-a * rho, -a * clipped_rho)
    if clip_c is not None and a < 0:
        loss = min(loss, clip_c * abs(a))
    return loss


def ref_token_grad(rho: float, a: float, clip_low: float, clip_high: float, clip_c: float | None) -> float:
    """dL/dlogp: -A rho where the unclipped term is active, 0 in the three clipped regions."""
    if a > 0 and rho > 1.0 + clip_high:
        return 0.0
    if a < 0 and rho < 1.0 - clip_low:
        return 0.0
    if a < 0 and clip_c is not None and rho > clip_c:
        return 0.0
    return -a * rho


def ref_policy_loss(
    logp: list[list[float]],
    old_logp: list[list[float]],
    adv: list[list[float]],
    mask: list[list[float]],
    *,
    clip_low: float,
    clip_high: float,
    clip_c: float | None,
    agg: str,
    num_tokens: float | None = None,
    num_seqs: float | None = None,
    norm_len: float | None = None,
) -> tuple[float, list[list[float]]]:
    """(loss, d loss / d logp) with per-token advantages adv[i][t]; masked tokens are skipped entirely."""
    lengths = [sum(1 for m in row if m) for row in mask]
    n = num_tokens if num_tokens is not None else sum(lengths)
    b = num_seqs if num_seqs is not None else sum(1 for k in lengths if k > 0)
    loss = 0.0
    grad = [[0.0] * len(row) for row in logp]
    for i, row in enumerate(logp):
        for t in range(len(row)):
            if not mask[i][t]:
                continue
            log_ratio = logp[i][t] - old_logp[i][t]
            rho = math.exp(min(max(log_ratio, -20.0), 20.0))
            if agg == "token-mean":
                w = 1.0 / n
            elif agg == "seq-mean-token-mean":
                w = 1.0 / (b * lengths[i])
            elif agg == "seq-mean-token-sum":
                w = 1.0 / b
            elif agg == "seq-mean-token-sum-norm":
                w = 1.0 / (b * norm_len)
            else:
                raise ValueError(agg)
            a = adv[i][t]
            loss += w * ref_token_loss(rho, a, clip_low, clip_high, clip_c)
            inside_clamp = abs(log_ratio) < 20.0
            grad[i][t] = w * ref_token_grad(rho, a, clip_low, clip_high, clip_c) if inside_clamp else 0.0
    return loss, grad
