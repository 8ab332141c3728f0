"""Hypothesis strategies and helpers shared by the tests/rl property tests (float64 throughout)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from hypothesis import settings
from hypothesis import strategies as st

from memagent.rl import AGG_MODES

FAST = settings(max_examples=40, deadline=None, derandomize=True, database=None)
"""Modest, reproducible example counts: the machine is small and the suite must stay within seconds."""
NORM_LEN = 16.0
"""The constant L_c used for seq-mean-token-sum-norm in tests."""


@dataclass(frozen=True)
class Batch:
    """One micro-batch of rows: logp, old_logp, mask [B, T] float64; adv [B] or [B, T] float64."""

    logp: torch.Tensor
    old_logp: torch.Tensor
    adv: torch.Tensor
    mask: torch.Tensor

    def adv_tokens(self) -> torch.Tensor:
        """[B, T] advantages (broadcast along T when given per row)."""
        return self.adv[:, None].expand_as(self.logp) if self.adv.dim() == 1 else self.adv


@st.composite
def batches(
    draw: st.DrawFn,
    *,
    max_rows: int = 5,
    max_len: int = 8,
    spread: float = 1.5,
    on_policy: bool = False,
    per_token_adv: bool | None = None,
    min_rows: int = 1,
) -> Batch:
    """Random rows, each with at least one valid token; log-ratios uniform in [-spread, spread]."""
    b = draw(st.integers(min_rows, max_rows))
    t = draw(st.integers(1, max_len))
    seed = draw(st.integers(0, 2**31 - 1))
    per_token = draw(st.booleans()) if per_token_adv is None else per_token_adv
    g = torch.Generator().manual_seed(seed)
    logp = -3.0 * torch.rand(b, t, generator=g, dtype=torch.float64)
    old = logp if on_policy else logp + spread * (2.0 * torch.rand(b, t, generator=g, dtype=torch.float64) - 1.0)
    mask = (torch.rand(b, t, generator=g) < 0.7).double()
    mask[torch.arange(b), torch.randint(0, t, (b,), generator=g)] = 1.0
    adv_shape = (b, t) if per_token else (b,)
    adv = torch.randn(adv_shape, generator=g, dtype=torch.float64)
    return Batch(logp, old.clone(), adv, mask)


modes = st.sampled_from(AGG_MODES)
clip_cs = st.sampled_from([None, 3.0, 10.0])


def norm_len_for(agg: str) -> float | None:
    return NORM_LEN if agg == "seq-mean-token-sum-norm" else None


def token_weights(mask: torch.Tensor, agg: str, norm_len: float | None = None) -> torch.Tensor:
    """[B, T] weight w of each token's loss in the aggregated loss (docs/rl-math.md §3), from the mask alone."""
    valid = mask != 0
    lengths = valid.sum(-1, keepdim=True).double()
    n = valid.sum().double()
    b = (lengths > 0).sum().double()
    if agg == "token-mean":
        w = torch.ones_like(mask, dtype=torch.float64) / n
    elif agg == "seq-mean-token-mean":
        w = 1.0 / (b * lengths.clamp(min=1)).expand_as(mask)
    elif agg == "seq-mean-token-sum":
        w = torch.ones_like(mask, dtype=torch.float64) / b
    else:
        w = torch.ones_like(mask, dtype=torch.float64) / (b * norm_len)
    return torch.where(valid, w, torch.zeros_like(w))


def grad_of(loss: torch.Tensor, leaf: torch.Tensor) -> torch.Tensor:
    (g,) = torch.autograd.grad(loss, leaf)
    return g
