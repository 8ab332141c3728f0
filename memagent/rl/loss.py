"""DAPO clipped policy-gradient loss with clip-higher, dual clip and a global normalizer.

Per token (PPO clip, arXiv 1707.06347; clip-higher, DAPO arXiv 2503.14476 Sec. 3.1; dual clip, arXiv 1912.09729):
    rho = exp(clamp(logp - old_logp, -20, 20))
    L   = max(-A rho, -A clip(rho, 1 - clip_low, 1 + clip_high))
    L   = min(L, clip_c |A|)          only where A < 0
Aggregation over the valid tokens of ONE optimizer step (DAPO's token-level loss, Sec. 3.3): the normalizers
num_tokens / num_seqs are counted over every micro-batch and every data-parallel rank before micro-batching, so
summing the micro-batch gradients (and averaging ranks, with the loss scaled by the rank count) gives exactly the
full-batch gradient (docs/rl-math.md §3; verl issue #5625 is what happens otherwise).

What this leaves out: the KL and entropy terms (kl.py, entropy.py; aggregate them with `aggregate`), GSPO/CISPO
ratios, and the optimizer step itself (step.py).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
from torch import Tensor

AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
LOG_RATIO_CLAMP = 20.0
"""verl / OpenRLHF clamp the log-ratio to [-20, 20] before exp so a stale log-prob cannot overflow."""

Count = int | float | Tensor


@dataclass(frozen=True)
class LossMetrics:
    """Diagnostics of one policy_loss call: masked means over this call's valid tokens, detached 0-dim tensors."""

    clipfrac: Tensor
    """Fraction of tokens whose clipped term is active: (A > 0, rho > 1 + clip_high) or (A < 0, rho < 1 - clip_low)."""
    clipfrac_lower: Tensor
    """Fraction of tokens cut by the dual clip: A < 0 and rho > clip_c (0 when clip_c is None)."""
    approx_kl: Tensor
    """Mean of old_logp - logp (verl's ppo_kl, the k1 estimate of KL(old || new)); 0 on-policy."""
    ratio_mean: Tensor
    """Mean importance ratio rho; 1 on-policy."""
    num_valid_tokens: Tensor
    """Number of valid tokens of this call (int64), the weight to combine these means across micro-batches."""

    def as_dict(self) -> dict[str, float]:
        """Plain floats keyed by field name, for logging."""
        return {f.name: float(getattr(self, f.name)) for f in fields(self)}


def _positive(name: str, value: Count | None) -> None:
    if value is not None and not float(value) > 0:
        raise ValueError(f"{name}: expected a positive global count (or None for this call's own), got {value}")


def aggregate(
    values: Tensor,
    mask: Tensor,
    *,
    agg: str = "token-mean",
    num_tokens: Count | None = None,
    num_seqs: Count | None = None,
    norm_len: float | None = None,
) -> Tensor:
    """Reduce per-token values to one scalar with a (global) normalizer; values at mask == 0 are ignored.

    Args:
        values: [B, T] float, per-token loss terms (policy surrogate, KL, entropy). NaN/inf at masked positions
            never reach the result or its gradient.
        mask: [B, T] bool or 0/1 numeric, nonzero = valid token.
        agg: "token-mean" sum(m v) / num_tokens; "seq-mean-token-mean" (1/num_seqs) sum_i mean_t(v_i);
            "seq-mean-token-sum" sum(m v) / num_seqs; "seq-mean-token-sum-norm" sum(m v) / (num_seqs * norm_len).
        num_tokens: global valid-token count of the optimizer step; None = this call's own count.
        num_seqs: global count of rows with at least one valid token; None = this call's own count
            (fully masked rows are not counted).
        norm_len: the constant L_c of "seq-mean-token-sum-norm" (Dr. GRPO); required for that mode only.
    Returns:
        0-dim tensor in values' dtype. An empty batch (B == 0), or a call without valid tokens given a positive
        global normalizer, gives 0 with a zero gradient, still connected to values' graph.
    """
    if agg not in AGG_MODES:
        raise ValueError(f"agg: expected one of {AGG_MODES}, got {agg!r}")
    if values.dim() != 2:
        raise ValueError(f"values: expected a [B, T] tensor, got shape {tuple(values.shape)}")
    if mask.shape != values.shape:
        raise ValueError(f"mask: expected shape {tuple(values.shape)} (as values), got {tuple(mask.shape)}")
    _positive("num_tokens", num_tokens)
    _positive("num_seqs", num_seqs)
    _positive("norm_len", norm_len)
    if agg == "seq-mean-token-sum-norm" and norm_len is None:
        raise ValueError("norm_len: agg='seq-mean-token-sum-norm' needs a constant norm_len (L_c), got None")
    valid = mask.bool()
    masked = torch.where(valid, values, torch.zeros_like(values))  # `where`, not `*`: 0 * NaN would be NaN
    if values.shape[0] == 0:
        return masked.sum()
    row_len = valid.sum(dim=-1)  # [B]
    if agg == "token-mean":
        return masked.sum() / _own_or_global(num_tokens, row_len.sum(), "num_tokens")
    seqs = _own_or_global(num_seqs, (row_len > 0).sum(), "num_seqs")
    if agg == "seq-mean-token-mean":
        # Fully masked rows contribute 0 / 1 = 0 (and are not counted in this call's own num_seqs).
        return (masked.sum(dim=-1) / row_len.clamp(min=1)).sum() / seqs
    if agg == "seq-mean-token-sum":
        return masked.sum() / seqs
    return masked.sum() / (seqs * norm_len)


def _own_or_global(given: Count | None, own: Tensor, name: str) -> Count | Tensor:
    if given is not None:
        return given
    if int(own) == 0:
        raise ValueError(
            f"mask has no valid token: pass the global {name} (num_tokens/num_seqs of the whole step) so this "
            "micro-batch contributes 0 instead of 0/0"
        )
    return own


def clipped_token_loss(
    ratio: Tensor, advantages: Tensor, *, clip_low: float = 0.2, clip_high: float = 0.28, clip_c: float | None = 10.0
) -> Tensor:
    """Elementwise clipped surrogate: max(-A rho, -A clip(rho, 1-clip_low, 1+clip_high)), then min(., c|A|) if A<0.

    Args:
        ratio: [...] float, importance ratio rho (gradient flows through it).
        advantages: [...] float, same shape, treated as constants.
        clip_low, clip_high: the asymmetric trust region (DAPO clip-higher); float('inf') disables a side.
        clip_c: dual-clip constant c > 1 applied only where A < 0; None disables it.
    Returns:
        [...] per-token loss. Equivalent piecewise form: A > 0: -A min(rho, 1+clip_high);
        A < 0: |A| min(max(rho, 1-clip_low), c); A = 0: 0.
    """
    adv = advantages.detach()
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped)
    if clip_c is not None:
        # The cap is built only where A < 0 (inf elsewhere), so c = inf with A = 0 never forms inf * 0.
        cap = torch.where(adv < 0, -adv * clip_c, torch.full_like(adv, torch.inf))
        loss = torch.minimum(loss, cap)
    return loss


def _check_loss_args(
    logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, clip_low: float, clip_high: float,
    clip_c: float | None,
) -> None:
    if logp.dim() != 2 or not logp.is_floating_point():
        raise ValueError(f"logp: expected a float [B, T] tensor, got shape {tuple(logp.shape)} dtype {logp.dtype}")
    if old_logp.shape != logp.shape:
        raise ValueError(f"old_logp: expected shape {tuple(logp.shape)} (as logp), got {tuple(old_logp.shape)}")
    if mask.shape != logp.shape:
        raise ValueError(f"mask: expected shape {tuple(logp.shape)} (as logp), got {tuple(mask.shape)}")
    if advantages.shape not in (logp.shape[:1], logp.shape):
        raise ValueError(
            f"advantages: expected shape [B] {tuple(logp.shape[:1])} or [B, T] {tuple(logp.shape)}, "
            f"got {tuple(advantages.shape)}"
        )
    if not (clip_low >= 0 and clip_high >= 0):
        raise ValueError(f"clip_low, clip_high: expected >= 0, got {clip_low}, {clip_high}")
    if clip_c is not None and not clip_c > 1:
        raise ValueError(f"clip_c: expected > 1 (dual clip) or None to disable it, got {clip_c}")


def policy_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    clip_c: float | None = 10.0,
    agg: str = "token-mean",
    num_tokens: Count | None = None,
    num_seqs: Count | None = None,
    norm_len: float | None = None,
) -> tuple[Tensor, LossMetrics]:
    """DAPO policy-gradient loss of one micro-batch of conversation rows.

    Args:
        logp: [B, T] float, log pi_theta of the sampled tokens (carries the gradient).
        old_logp: [B, T] float, behaviour log-probs; treated as constants (detached).
        advantages: [B] (one per row, broadcast along T) or [B, T] float; treated as constants.
        mask: [B, T] bool or 0/1 numeric, nonzero = token sampled by the policy (EOS included).
        clip_low, clip_high, clip_c: see `clipped_token_loss`.
        agg, num_tokens, num_seqs, norm_len: see `aggregate`; pass the step's global counts when micro-batching.
    Returns:
        (loss, metrics): loss is a 0-dim tensor in logp's dtype (pass float32 log-probs), never NaN for these cases
        (empty batch, all-padding micro-batch with a global normalizer, NaN/inf at masked positions).
    """
    _check_loss_args(logp, old_logp, advantages, mask, clip_low, clip_high, clip_c)
    valid = mask.bool()
    zero = torch.zeros_like(logp)
    adv = advantages.detach().to(logp.dtype)
    adv = torch.where(valid, adv[:, None] if adv.dim() == 1 else adv, zero)  # [B, T]
    # Sanitize masked positions before any arithmetic, so their values (even NaN/inf) cannot reach the gradient.
    log_ratio = torch.where(valid, logp - old_logp.detach().to(logp.dtype), zero).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)  # [B, T]
    token_loss = clipped_token_loss(ratio, adv, clip_low=clip_low, clip_high=clip_high, clip_c=clip_c)
    loss = aggregate(token_loss, valid, agg=agg, num_tokens=num_tokens, num_seqs=num_seqs, norm_len=norm_len)
    return loss, _metrics(ratio.detach(), log_ratio.detach(), adv, valid, clip_low, clip_high, clip_c)


def _metrics(
    ratio: Tensor, log_ratio: Tensor, adv: Tensor, valid: Tensor, clip_low: float, clip_high: float,
    clip_c: float | None,
) -> LossMetrics:
    count = valid.sum()
    denom = count.clamp(min=1).to(ratio.dtype)

    def mean(x: Tensor) -> Tensor:
        return torch.where(valid, x.to(ratio.dtype), torch.zeros_like(ratio)).sum() / denom

    clipped = ((adv > 0) & (ratio > 1.0 + clip_high)) | ((adv < 0) & (ratio < 1.0 - clip_low))
    dual = (adv < 0) & (ratio > clip_c) if clip_c is not None else torch.zeros_like(valid)
    return LossMetrics(
        clipfrac=mean(clipped),
        clipfrac_lower=mean(dual),
        approx_kl=mean(-log_ratio),
        ratio_mean=mean(ratio),
        num_valid_tokens=count,
    )
