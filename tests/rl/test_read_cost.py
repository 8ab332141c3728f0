"""Gated memory's efficiency term (docs/gates.md, docs/rl-math.md §4): -lambda x chunks read / chunks in the document.

The vectorized function agrees with a plain-Python loop in float64; it is bounded, monotone and zero where it should
be; score_trajectories adds it to the total but leaves `correct` alone, so dynamic sampling ignores it.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from memagent.records import ANSWER, MEMORY, Conversation, Sample, Trajectory
from memagent.rl import read_cost_penalty
from memagent.rl.dynamic_sampling import QuestionStream, collect_groups
from memagent.rl.rewards import score_trajectories

from .batches import FAST

costs = st.sampled_from([0.0, 0.05, 0.3, 1.0, 2.5])


@st.composite
def reads(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor]:
    """[N] chunks read and [N] chunks in the document (read <= whole; some empty documents), float64."""
    whole = draw(st.lists(st.integers(0, 40), min_size=0, max_size=12))
    read = [draw(st.integers(0, w)) for w in whole]
    return torch.tensor(read, dtype=torch.float64), torch.tensor(whole, dtype=torch.float64)


def reference(read: list[float], whole: list[float], cost: float) -> list[float]:
    """The obvious loop: no chunk, no cost; else minus cost times the share read."""
    return [0.0 if w == 0 else -cost * (r / w) for r, w in zip(read, whole)]


@FAST
@given(reads(), costs)
def test_matches_the_plain_loop_in_float64(data, cost) -> None:
    read, whole = data
    out = read_cost_penalty(read, whole, cost=cost)
    assert out.dtype == torch.float64 and out.shape == read.shape
    assert out.tolist() == pytest.approx(reference(read.tolist(), whole.tolist(), cost), rel=1e-15, abs=0.0)


@FAST
@given(reads(), costs)
def test_bounded_zero_at_no_cost_and_a_full_read_pays_the_whole_cost(data, cost) -> None:
    read, whole = data
    out = read_cost_penalty(read, whole, cost=cost)
    assert bool((out <= 0).all()) and bool((out >= -cost).all())
    assert bool((read_cost_penalty(read, whole, cost=0.0) == 0).all())
    full = whole > 0
    assert torch.equal(read_cost_penalty(whole, whole, cost=cost)[full], torch.full_like(whole[full], -cost))
    assert bool((out[whole == 0] == 0).all())


@FAST
@given(reads(), costs, st.integers(0, 2**31 - 1))
def test_reading_more_of_the_same_document_never_pays_less(data, cost, seed) -> None:
    read, whole = data
    g = torch.Generator().manual_seed(seed)
    more = torch.minimum(read + torch.randint(0, 5, read.shape, generator=g).double(), whole)
    assert bool((read_cost_penalty(more, whole, cost=cost) <= read_cost_penalty(read, whole, cost=cost)).all())


def test_bad_arguments_are_refused_naming_them() -> None:
    one = torch.tensor([1.0])
    with pytest.raises(ValueError, match="cost"):
        read_cost_penalty(one, one, cost=-0.1)
    with pytest.raises(ValueError, match="chunks_read"):
        read_cost_penalty(torch.tensor([3.0]), torch.tensor([2.0]), cost=0.1)
    with pytest.raises(ValueError, match="shapes"):
        read_cost_penalty(one, torch.tensor([1.0, 2.0]), cost=0.1)


def _trajectory(index: int, read: int, whole: int, answer: str) -> Trajectory:
    memory = [Conversation([1], [2], [1], torch.zeros(1), True, MEMORY, k, "m") for k in range(read)]
    final = Conversation([1], [3], [1], torch.zeros(1), True, ANSWER, -1, answer)
    return Trajectory(sample_index=index, conversations=[*memory, final], answer=answer, num_chunks=read,
                      document_chunks=whole)


def _score(trajectories: list[Trajectory], samples: list[Sample], read_cost: float) -> None:
    score_trajectories(trajectories, samples, verifier="strict", answer_budget=8, overlong_shaping=False,
                       overlong_cache_tokens=4, overlong_factor=1.0, read_cost=read_cost)


def test_score_adds_the_term_to_the_total_and_leaves_correct_alone() -> None:
    samples = [Sample("doc", "q", ["a"])]
    trajectories = [_trajectory(0, 2, 8, "\\boxed{a}"), _trajectory(0, 8, 8, "\\boxed{b}"), _trajectory(0, 0, 0, "")]
    _score(trajectories, samples, read_cost=0.4)
    assert [t.reward.correct for t in trajectories] == [1.0, 0.0, 0.0]
    assert [t.reward.read_cost for t in trajectories] == pytest.approx([-0.1, -0.4, 0.0])
    assert [t.reward.total for t in trajectories] == pytest.approx([0.9, -0.4, 0.0])
    _score(trajectories, samples, read_cost=0.0)
    assert [t.reward.read_cost for t in trajectories] == [0.0, 0.0, 0.0]


def test_dynamic_sampling_ignores_the_read_cost() -> None:
    """Every group is all correct but reads differently: totals differ, correctness does not, so none is kept."""
    samples = [Sample("doc", f"q{i}", ["a"], index=i) for i in range(6)]

    def rollout(questions: list[Sample]) -> list[Trajectory]:
        return [_trajectory(i, 1 + j, 4, "\\boxed{a}") for i in range(len(questions)) for j in range(3)]

    with pytest.warns(UserWarning, match="informative groups"):
        kept = collect_groups(QuestionStream(len(samples), 0), samples, 2, rollout=rollout,
                              score=lambda trajs, qs: _score(trajs, qs, read_cost=0.5), max_over_ranks=lambda n: n,
                              rank=0, world_size=1, dynamic_sampling=True, max_refill_rounds=0,
                              refill_oversample_cap=4.0, refill_margin_std=0.5)
    assert len({t.reward.total for t in kept.generated}) == 3 and kept.questions == []
