"""Group advantages: docs/rl-math.md §6 properties 1-7 (shift, scale, centering, binary form, order, zeros)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from memagent.rl import group_advantages

from .batches import FAST
from .reference import ref_group_advantages

EPS = 1e-6


@st.composite
def grouped_rewards(draw: st.DrawFn, *, min_size: int = 1, quarter_steps: bool = False):
    """(rewards [N] float64, group_ids [N] int64, number of groups), groups contiguous."""
    sizes = draw(st.lists(st.integers(min_size, 6), min_size=1, max_size=4))
    value = (
        st.integers(-40, 40).map(lambda k: k / 4)
        if quarter_steps
        else st.floats(-10, 10, allow_nan=False, allow_infinity=False)
    )
    rewards = [draw(value) for _ in range(sum(sizes))]
    ids = [g for g, s in enumerate(sizes) for _ in range(s)]
    return torch.tensor(rewards, dtype=torch.float64), torch.tensor(ids), len(sizes)


def _groups(ids: torch.Tensor) -> list[torch.Tensor]:
    return [ids == g for g in ids.unique()]


@FAST
@given(grouped_rewards(), st.lists(st.floats(-100, 100), min_size=4, max_size=4), st.booleans())
def test_advantages_invariant_to_per_group_shift(data, shifts, scale_by_std):
    r, ids, _ = data
    shifted = r + torch.tensor(shifts, dtype=torch.float64)[ids]
    a = group_advantages(r, ids, scale_by_std=scale_by_std)
    b = group_advantages(shifted, ids, scale_by_std=scale_by_std)
    # A shift can make a noisy group exactly constant or not in float; compare where both are defined.
    assert torch.allclose(a, b, atol=1e-6 * (1 + max(abs(s) for s in shifts)))


@FAST
@given(grouped_rewards(quarter_steps=True), st.sampled_from([0.5, 2.0, 4.0, 0.25]))
def test_mean_only_advantages_scale_linearly(data, c):
    r, ids, _ = data
    # Powers of two keep every operation exact, so the identity holds bit for bit.
    assert torch.equal(group_advantages(c * r, ids, scale_by_std=False), c * group_advantages(r, ids, scale_by_std=False))


@FAST
@given(grouped_rewards(min_size=2), st.floats(1e-3, 1e3))
def test_std_advantages_scale_as_eps_over_c(data, c):
    r, ids, _ = data
    expected = torch.zeros_like(r)
    for g in _groups(ids):
        x = r[g]
        if x.max() > x.min():
            expected[g] = (x - x.mean()) / (x.std() + EPS / c)
    assert torch.allclose(group_advantages(c * r, ids), expected, rtol=1e-9, atol=1e-9)


@FAST
@given(grouped_rewards(), st.booleans())
def test_advantages_sum_to_zero_per_group(data, scale_by_std):
    r, ids, _ = data
    a = group_advantages(r, ids, scale_by_std=scale_by_std)
    for g in _groups(ids):
        assert abs(float(a[g].sum())) <= 1e-9 * (1 + float(a[g].abs().sum()))


@FAST
@given(grouped_rewards(min_size=2))
def test_squared_advantages_follow_bessel_identity_and_bounds(data):
    r, ids, _ = data
    a = group_advantages(r, ids)
    for g in _groups(ids):
        size, x = int(g.sum()), r[g]
        sigma = float(x.std())
        expected = (size - 1) * sigma**2 / (sigma + EPS) ** 2 if x.max() > x.min() else 0.0
        assert math.isclose(float((a[g] ** 2).sum()), expected, rel_tol=1e-9, abs_tol=1e-12)
        assert expected <= size - 1
        assert float(a[g].abs().max()) <= (size - 1) / math.sqrt(size) + 1e-12  # Samuelson bound


@pytest.mark.parametrize("size", [2, 3, 5, 8, 16])
def test_binary_rewards_match_closed_form(size):
    for k in range(1, size):
        r = torch.tensor([1.0] * k + [0.0] * (size - k), dtype=torch.float64)
        a = group_advantages(r, torch.zeros(size, dtype=torch.long), eps=0.0)
        p = k / size
        sigma = math.sqrt(size * p * (1 - p) / (size - 1))
        assert torch.allclose(a[:k], torch.full((k,), (1 - p) / sigma, dtype=torch.float64), rtol=1e-12)
        assert torch.allclose(a[k:], torch.full((size - k,), -p / sigma, dtype=torch.float64), rtol=1e-12)


@FAST
@given(grouped_rewards(min_size=2, quarter_steps=True), st.booleans())
def test_advantages_strictly_monotone_in_reward_within_group(data, scale_by_std):
    r, ids, _ = data
    a = group_advantages(r, ids, scale_by_std=scale_by_std)
    same_group = ids[:, None] == ids[None, :]
    higher = r[:, None] > r[None, :]
    assert bool((a[:, None] > a[None, :])[same_group & higher].all())


@FAST
@given(grouped_rewards(), st.integers(0, 2**31 - 1), st.booleans())
def test_advantages_equivariant_to_permuting_and_interleaving_groups(data, seed, scale_by_std):
    r, ids, _ = data
    perm = torch.randperm(len(r), generator=torch.Generator().manual_seed(seed))
    relabel = (ids * 7 + 3)[perm]  # arbitrary, non-contiguous id values in an interleaved order
    a = group_advantages(r, ids, scale_by_std=scale_by_std)
    # Summation order changes the last bits only.
    got = group_advantages(r[perm], relabel, scale_by_std=scale_by_std)
    assert torch.allclose(got, a[perm], rtol=1e-12, atol=1e-12)


@FAST
@given(st.floats(-1e6, 1e6), st.integers(1, 32), st.booleans(), st.sampled_from([torch.float32, torch.float64]))
def test_constant_groups_give_exact_zero(value, size, scale_by_std, dtype):
    r = torch.full((size,), value, dtype=dtype)
    a = group_advantages(r, torch.zeros(size, dtype=torch.long), scale_by_std=scale_by_std)
    assert a.dtype == dtype
    assert bool((a == 0).all())


@pytest.mark.parametrize("scale_by_std", [True, False])
def test_constant_float32_group_of_2_2_gives_exact_zero(scale_by_std):
    # The pitfall of docs/rl-math.md §7: a float32 mean of 16 copies of 2.2 is one ulp off.
    r = torch.full((16,), 2.2, dtype=torch.float32)
    running = torch.zeros((), dtype=torch.float32)
    for x in r:
        running = running + x
    assert running / 16 != r[0]  # the premise: a sequential float32 mean is off, so naive A would be about -0.24
    a = group_advantages(r, torch.zeros(16, dtype=torch.int32), scale_by_std=scale_by_std)
    assert bool((a == 0).all())


def test_singleton_groups_give_zero():
    r = torch.tensor([3.0, 1.0, 2.0, 5.0], dtype=torch.float64)
    a = group_advantages(r, torch.tensor([0, 1, 1, 2]))
    assert a[0] == 0 and a[3] == 0
    assert a[1] < 0 < a[2]


@FAST
@given(grouped_rewards(), st.booleans(), st.sampled_from([0.0, 1e-6, 0.1]))
def test_advantages_match_loop_reference(data, scale_by_std, eps):
    r, ids, _ = data
    expected = ref_group_advantages(r.tolist(), ids.tolist(), scale_by_std, eps)
    got = group_advantages(r, ids, scale_by_std=scale_by_std, eps=eps)
    assert torch.allclose(got, torch.tensor(expected, dtype=torch.float64), rtol=1e-9, atol=1e-9)


def test_integer_rewards_give_default_float_advantages():
    a = group_advantages(torch.tensor([1, 0, 0, 1]), torch.zeros(4, dtype=torch.long))
    assert a.dtype == torch.get_default_dtype()
    assert torch.allclose(a, torch.tensor([1.0, -1.0, -1.0, 1.0]) * 0.5 / (math.sqrt(1 / 3) + EPS))
