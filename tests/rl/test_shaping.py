"""DAPO overlong shaping and the dynamic-sampling filter: docs/rl-math.md §6 properties 23-24."""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st

from memagent.rl import keep_informative_groups, overlong_penalty

from .batches import FAST

lengths_and_caps = st.integers(2, 400).flatmap(
    lambda max_len: st.tuples(st.just(max_len), st.integers(1, max_len))
)
factors = st.sampled_from([1.0, 0.5, 2.0])


@FAST
@given(lengths_and_caps, factors)
def test_overlong_penalty_shape(caps, factor):
    max_len, cache = caps
    lengths = torch.arange(0, max_len + 50)
    pen = overlong_penalty(lengths, max_len=max_len, cache_len=cache, factor=factor)
    safe = lengths <= max_len - cache
    assert bool((pen[safe] == 0).all()), "zero up to max_len - cache_len"
    band = (~safe) & (lengths < max_len)
    expected = ((max_len - cache) - lengths[band].double()) / cache * factor
    assert torch.allclose(pen[band].double(), expected, rtol=1e-6), "linear in the band"
    assert bool((pen[lengths >= max_len] == -factor).all()), "-factor from max_len on"
    assert bool((pen <= 0).all()), "never positive"
    assert bool((pen[1:] <= pen[:-1]).all()), "non-increasing"


@FAST
@given(lengths_and_caps, factors)
def test_overlong_penalty_continuous(caps, factor):
    max_len, cache = caps
    lengths = torch.linspace(0, max_len + 10, 2001, dtype=torch.float64)
    pen = overlong_penalty(lengths, max_len=max_len, cache_len=cache, factor=factor)
    step = float(lengths[1] - lengths[0])
    # A continuous piecewise-linear function with slope factor / cache_len moves at most that much per step.
    assert float((pen[1:] - pen[:-1]).abs().max()) <= factor / cache * step + 1e-12


@st.composite
def grouped(draw: st.DrawFn):
    sizes = draw(st.lists(st.integers(1, 5), min_size=1, max_size=5))
    ids = torch.tensor([g * 3 + 1 for g, s in enumerate(sizes) for _ in range(s)])
    rewards = torch.tensor([float(draw(st.integers(0, 1))) for _ in range(sum(sizes))], dtype=torch.float64)
    perm = torch.randperm(len(ids), generator=torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1))))
    return rewards[perm], ids[perm]


@FAST
@given(grouped())
def test_keep_informative_groups_keeps_whole_groups_with_spread(data):
    rewards, ids = data
    keep = keep_informative_groups(rewards, ids)
    assert keep.dtype == torch.bool
    for g in ids.unique():
        member = ids == g
        assert keep[member].all() or not keep[member].any(), "whole groups only"
        spread = rewards[member].max() > rewards[member].min()
        assert bool(keep[member][0]) == bool(spread), "kept iff the rewards are not all equal (size 1: dropped)"


@FAST
@given(grouped())
def test_keep_informative_groups_idempotent(data):
    rewards, ids = data
    keep = keep_informative_groups(rewards, ids)
    again = keep_informative_groups(rewards[keep], ids[keep])
    assert bool(again.all())
