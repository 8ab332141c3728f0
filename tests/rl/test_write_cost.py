"""Gated memory's writing term (docs/gates.md, "Reward"): -mu x memory tokens written / (budget x chunks), capped.

The vectorized function agrees with a plain-Python loop in float64; it is bounded, zero for a trajectory that wrote
no memory, never pays less for writing more; score_trajectories adds it to the total and leaves `correct` alone.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from memagent.records import ANSWER, MEMORY, Conversation, Sample, Trajectory
from memagent.rl import write_cost_penalty
from memagent.rl.rewards import score_trajectories

from .batches import FAST

costs = st.sampled_from([0.0, 0.05, 0.3, 1.0, 2.5])
budgets = st.integers(1, 64)


@st.composite
def writes(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor]:
    """[N] memory tokens written and [N] chunks in the document (some empty documents; some over the budget), float64."""
    whole = draw(st.lists(st.integers(0, 40), min_size=0, max_size=12))
    written = [draw(st.integers(0, 70 * w + 3)) for w in whole]
    return torch.tensor(written, dtype=torch.float64), torch.tensor(whole, dtype=torch.float64)


def reference(written: list[float], whole: list[float], budget: int, cost: float) -> list[float]:
    """The obvious loop: no chunk, no cost; else minus cost times the share of the most it could write, at most 1."""
    return [0.0 if w == 0 else -cost * min(1.0, t / (budget * w)) for t, w in zip(written, whole)]


@FAST
@given(writes(), budgets, costs)
def test_matches_the_plain_loop_in_float64(data, budget, cost) -> None:
    written, whole = data
    out = write_cost_penalty(written, whole, memory_budget=budget, cost=cost)
    assert out.dtype == torch.float64 and out.shape == written.shape
    assert out.tolist() == pytest.approx(reference(written.tolist(), whole.tolist(), budget, cost), rel=1e-15, abs=0.0)


@FAST
@given(writes(), budgets, costs)
def test_bounded_zero_without_writing_and_a_full_memory_every_chunk_pays_the_whole_cost(data, budget, cost) -> None:
    written, whole = data
    out = write_cost_penalty(written, whole, memory_budget=budget, cost=cost)
    assert bool((out <= 0).all()) and bool((out >= -cost).all())
    assert bool((write_cost_penalty(torch.zeros_like(whole), whole, memory_budget=budget, cost=cost) == 0).all())
    full = whole > 0
    every_chunk = write_cost_penalty(whole * budget, whole, memory_budget=budget, cost=cost)
    assert torch.equal(every_chunk[full], torch.full_like(whole[full], -cost))
    assert bool((out[whole == 0] == 0).all())


@FAST
@given(writes(), budgets, costs, st.integers(0, 2**31 - 1))
def test_writing_more_for_the_same_document_never_pays_less(data, budget, cost, seed) -> None:
    written, whole = data
    g = torch.Generator().manual_seed(seed)
    more = written + torch.randint(0, 9, written.shape, generator=g).double()
    assert bool((write_cost_penalty(more, whole, memory_budget=budget, cost=cost)
                 <= write_cost_penalty(written, whole, memory_budget=budget, cost=cost)).all())


def test_bad_arguments_are_refused_naming_them() -> None:
    one = torch.tensor([1.0])
    with pytest.raises(ValueError, match="cost"):
        write_cost_penalty(one, one, memory_budget=4, cost=-0.1)
    with pytest.raises(ValueError, match="memory_budget"):
        write_cost_penalty(one, one, memory_budget=0, cost=0.1)
    with pytest.raises(ValueError, match="memory_tokens"):
        write_cost_penalty(torch.tensor([-1.0]), one, memory_budget=4, cost=0.1)
    with pytest.raises(ValueError, match="shapes"):
        write_cost_penalty(one, torch.tensor([1.0, 2.0]), memory_budget=4, cost=0.1)


def _trajectory(memory_tokens: list[int], whole: int, answer: str, decisions: list[str]) -> Trajectory:
    """Memory updates whose responses have memory_tokens[k] memory tokens after a one-token decision."""
    memory = [Conversation([1], [2] * (1 + n), [1] * (1 + n), torch.zeros(1 + n), True, MEMORY, k, "m",
                           decision=d, decision_tokens=1) for k, (n, d) in enumerate(zip(memory_tokens, decisions))]
    final = Conversation([1], [3], [1], torch.zeros(1), True, ANSWER, -1, answer)
    return Trajectory(sample_index=0, conversations=[*memory, final], answer=answer, num_chunks=len(memory_tokens),
                      document_chunks=whole)


def test_score_charges_updates_not_keeps_and_leaves_correct_alone() -> None:
    samples = [Sample("doc", "q", ["a"])]
    keeps = _trajectory([0, 4, 0, 0], 4, "\\boxed{a}", ["KEEP", "UPDATE", "KEEP", "KEEP"])
    updates = _trajectory([4, 4, 4, 4], 4, "\\boxed{a}", ["UPDATE"] * 4)
    wrong = _trajectory([8, 8], 4, "\\boxed{b}", ["UPDATE", "UPDATE"])
    trajectories = [keeps, updates, wrong]
    score_trajectories(trajectories, samples, verifier="strict", answer_budget=8, overlong_shaping=False,
                       overlong_cache_tokens=4, overlong_factor=1.0, write_cost=0.5, memory_budget=8)
    assert [t.reward.correct for t in trajectories] == [1.0, 1.0, 0.0]
    assert [t.reward.write_cost for t in trajectories] == pytest.approx([-0.0625, -0.25, -0.25])
    assert [t.reward.total for t in trajectories] == pytest.approx([0.9375, 0.75, -0.25])
    assert all(t.reward.read_cost == 0.0 for t in trajectories)
