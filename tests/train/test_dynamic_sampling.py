"""Dynamic sampling with refills (DAPO Sec. 3.2), on the path users run: dynamic_sampling on, several refill rounds.

A fake rollout builds real Trajectory / Conversation records, each tagged with the question it answers and its
rollout number, and with a \\boxed{} answer that the strict verifier scores right or wrong by a drawn pattern.
Properties: every kept group holds exactly G distinct trajectories of the question `questions` lists for it, no
trajectory appears twice, groups are contiguous; refills over-sample by the observed keep rate so that one refill
usually fills the batch; every simulated rank takes the same number of questions from the stream per round.
"""

from __future__ import annotations

import threading

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from memagent.records import ANSWER, MEMORY, Conversation, Reward, Sample, Trajectory
from memagent.rl.dynamic_sampling import QuestionStream, collect_groups, refill_size
from memagent.rl.rewards import score_trajectories


def make_samples(n: int) -> list[Sample]:
    return [Sample(context="doc", question=f"question {i}", answers=[f"gold{i}"], index=i) for i in range(n)]


def fake_rollout(group_size: int, correct: callable, calls: list[int]):
    """A rollout callable: G trajectories per sample, tagged "q{index}/r{j}/call{n}/p{position}" (a call that spans
    the stream's epoch boundary may hold a question twice), correct where correct(index, j)."""

    def rollout(samples: list[Sample]) -> list[Trajectory]:
        calls.append(len(samples))
        out = []
        for position, sample in enumerate(samples):
            for j in range(group_size):
                tag = f"q{sample.index}/r{j}/call{len(calls)}/p{position}"
                answer = f"\\boxed{{gold{sample.index}}}" if correct(sample.index, j) else "\\boxed{wrong}"
                memory = Conversation([1, 2], [3], [1], torch.zeros(1), True, MEMORY, 0, tag)
                final = Conversation([1, 2], [4, 5], [1, 1], torch.zeros(2), True, ANSWER, -1, answer)
                out.append(Trajectory(sample_index=position, conversations=[memory, final], answer=answer))
        return out

    return rollout


def tag(traj: Trajectory) -> str:
    return traj.conversations[0].text


def check_groups(kept: list[Trajectory], questions: list[Sample], group_size: int) -> None:
    assert len(kept) == group_size * len(questions)
    tags = [tag(t) for t in kept]
    assert len(set(tags)) == len(tags), "a trajectory appears twice"
    for k, question in enumerate(questions):
        members = kept[k * group_size : (k + 1) * group_size]
        assert all(t.sample_index == k for t in members), "groups must be contiguous and indexed by position"
        assert all(tag(t).startswith(f"q{question.index}/") for t in members), [tag(t) for t in members]
        assert len({tag(t).split("/")[1] + tag(t).split("/")[2] for t in members}) == group_size


def strict_score(trajectories: list[Trajectory], questions: list[Sample]) -> None:
    score_trajectories(trajectories, questions, verifier="strict", answer_budget=8, overlong_shaping=False,
                       overlong_cache_tokens=4, overlong_factor=1.0)


def config(max_refill_rounds: int, refill_oversample_cap: float = 4.0, refill_margin_std: float = 0.5) -> dict:
    """collect_groups' settings under dynamic sampling, scored by the strict verifier."""
    return dict(dynamic_sampling=True, max_refill_rounds=max_refill_rounds,
                refill_oversample_cap=refill_oversample_cap, refill_margin_std=refill_margin_std,
                score=strict_score)


@settings(max_examples=60, deadline=None)
@given(group_size=st.integers(2, 5), quota=st.integers(1, 6), refills=st.integers(0, 5),
       pattern=st.lists(st.integers(0, 2), min_size=1, max_size=40), seed=st.integers(0, 3))
def test_every_kept_group_holds_g_distinct_trajectories_of_its_own_question(group_size, quota, refills, pattern,
                                                                             seed) -> None:
    samples = make_samples(40)
    # pattern[i % len]: 0 = all wrong, 1 = all right (both uninformative), 2 = mixed (kept)
    kinds = lambda i: pattern[i % len(pattern)]  # noqa: E731
    correct = lambda i, j: kinds(i) == 1 or (kinds(i) == 2 and j == 0)  # noqa: E731
    calls: list[int] = []
    got = collect_groups(QuestionStream(len(samples), seed), samples, quota, **config(max_refill_rounds=refills),
                         rollout=fake_rollout(group_size, correct, calls), max_over_ranks=lambda n: n, rank=0,
                         world_size=1)
    check_groups(got.trajectories, got.questions, group_size)
    assert len(got.questions) <= quota
    assert got.rounds == len(calls) <= refills + 1
    informative = sum(kinds(s.index) == 2 for s in samples)
    if 2 in pattern and got.rounds <= refills and informative:
        assert len(got.questions) == quota, "stopped early without filling the quota"


@pytest.mark.parametrize("margin", [0.5, 2.0])
def test_a_refill_oversamples_by_the_observed_keep_rate(margin: float) -> None:
    """Half the questions are informative: the refill asks for at least the missing count over the keep rate, not
    for the missing count (which would need about log2(quota) shrinking rounds); with a 2-std margin one refill
    fills the batch."""
    samples = make_samples(400)
    correct = lambda i, j: i % 2 == 0 and j == 0  # noqa: E731  (even questions mixed, odd ones all wrong)
    calls: list[int] = []
    got = collect_groups(QuestionStream(len(samples), 0), samples, 16,
                         **config(max_refill_rounds=4, refill_margin_std=margin),
                         rollout=fake_rollout(4, correct, calls), max_over_ranks=lambda n: n, rank=0,
                         world_size=1)
    check_groups(got.trajectories, got.questions, 4)
    kept_first = sum(i % 2 == 0 for i in QuestionStream(len(samples), 0).take(16))
    assert 0 < kept_first < 16
    assert calls[0] == 16
    assert calls[1] >= (16 - kept_first) * 16 / kept_first
    assert len(calls) == 2 or margin < 2, calls
    assert len(got.questions) == 16


def test_the_oversampling_factor_is_capped() -> None:
    """One informative question in 40: the refill asks for at most cap x the missing count."""
    samples = make_samples(400)
    correct = lambda i, j: i % 40 == 0 and j == 0  # noqa: E731
    calls: list[int] = []
    collect_groups(QuestionStream(len(samples), 0), samples, 8, **config(max_refill_rounds=1, refill_oversample_cap=3.0),
                   rollout=fake_rollout(2, correct, calls), max_over_ranks=lambda n: n, rank=0, world_size=1,)
    assert len(calls) == 2 and calls[1] <= 3 * 8


def run_ranks(world_size: int, quota_of, correct_of, refills: int, samples: list[Sample]):
    """collect_groups on `world_size` threads with a real max-over-ranks collective (a barrier)."""
    barrier = threading.Barrier(world_size)
    lock = threading.Lock()
    slots: dict[int, int] = {}
    results, streams, calls = [None] * world_size, [], [[] for _ in range(world_size)]

    def max_over_ranks(rank: int, n: int) -> int:
        with lock:
            slots[rank] = n
        barrier.wait()
        value = max(slots.values())
        barrier.wait()
        return value

    def worker(rank: int) -> None:
        stream = QuestionStream(len(samples), 0)
        streams.append((rank, stream))
        results[rank] = collect_groups(stream, samples, quota_of(rank), **config(max_refill_rounds=refills),
                                       rollout=fake_rollout(4, correct_of(rank), calls[rank]),
                                       max_over_ranks=lambda n: max_over_ranks(rank, n), rank=rank,
                                       world_size=world_size)

    threads = [threading.Thread(target=worker, args=(r,)) for r in range(world_size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return results, dict(streams), calls


def test_ranks_take_the_same_questions_per_round_and_disjoint_shares() -> None:
    samples = make_samples(300)
    # rank 1 sees mostly uninformative questions (uneven work), rank 0 mostly informative ones
    correct = lambda i, j: (i % 3 != 0) and j == 0  # noqa: E731
    results, streams, calls = run_ranks(2, lambda r: 5 + r, lambda r: correct, 4, samples)
    assert all(r is not None for r in results)
    assert streams[0].position == streams[1].position
    assert len(calls[0]) == len(calls[1]), "ranks must run the same number of rollout rounds (collectives)"
    indices = [s.index for r in results for s in r.questions]
    assert len(indices) == len(set(indices)), "two ranks trained on the same question"
    for r in results:
        check_groups(r.trajectories, r.questions, 4)


def brute_force_refill_size(need: int, kept: int, rolled: int, cap: float, margin_std: float) -> int:
    """The smallest k in [need, limit] whose expected informative groups minus margin_std binomial std reach need."""
    if need <= 0 or rolled == 0:
        return max(need, 0)
    limit = max(need, -(-cap * need // 1))
    p = kept / rolled
    for k in range(need, int(limit) + 1):
        if p > 0 and k * p - margin_std * (k * p * (1 - p)) ** 0.5 >= need:
            return k
    return int(limit)


@settings(max_examples=200, deadline=None)
@given(need=st.integers(-2, 40), rolled=st.integers(0, 60), kept_share=st.floats(0, 1),
       cap=st.floats(1, 6), margin=st.floats(0, 3))
def test_refill_size_is_the_smallest_count_whose_margin_covers_the_need(need, rolled, kept_share, cap, margin) -> None:
    kept = round(kept_share * rolled)
    assert refill_size(need, kept, rolled, cap, margin) == brute_force_refill_size(need, kept, rolled, cap, margin)


def test_a_larger_margin_never_asks_for_fewer_questions() -> None:
    sizes = [refill_size(8, 10, 20, 4.0, margin) for margin in (0.0, 0.5, 1.0, 2.0)]
    assert sizes == sorted(sizes) and sizes[0] == 16 and sizes[-1] > sizes[0]


def test_kept_groups_count_the_informative_groups_dropped_past_the_quota() -> None:
    samples = make_samples(400)
    correct = lambda i, j: j == 0  # noqa: E731  (every group informative)
    calls: list[int] = []
    got = collect_groups(QuestionStream(len(samples), 0), samples, 4, **config(max_refill_rounds=0),
                         rollout=fake_rollout(2, correct, calls), max_over_ranks=lambda n: n, rank=0, world_size=1)
    assert calls == [4] and got.informative_groups == 4 and len(got.questions) == 4
    half = lambda i, j: i % 2 == 0 and j == 0  # noqa: E731
    calls = []
    got = collect_groups(QuestionStream(len(samples), 0), samples, 4, **config(max_refill_rounds=3),
                         rollout=fake_rollout(2, half, calls), max_over_ranks=lambda n: n, rank=0, world_size=1)
    rolled = [samples[i] for i in QuestionStream(len(samples), 0).take(sum(calls))]
    assert got.informative_groups == sum(s.index % 2 == 0 for s in rolled) >= len(got.questions) == 4


def test_filtering_on_the_total_reward_keeps_all_correct_groups_that_differ_only_in_a_shaping_term() -> None:
    """Gated memory's read cost: four right answers that read different amounts are one group to learn from when
    dynamic sampling filters on the reward (rollout.filter_on reward), none when it filters on correctness."""
    samples = make_samples(40)

    def all_right_reading_apart(trajectories: list[Trajectory], questions: list[Sample]) -> None:
        for k, traj in enumerate(trajectories):
            traj.reward = Reward(correct=1.0, read_cost=-0.2 * (k % 2) if questions[traj.sample_index].index % 2 else 0)

    kept = {}
    for filter_on in ("correct", "reward"):
        kept[filter_on] = collect_groups(
            QuestionStream(len(samples), 0), samples, 4, **{**config(max_refill_rounds=1), "score": all_right_reading_apart},
            filter_on=filter_on, rollout=fake_rollout(2, lambda i, j: True, []), max_over_ranks=lambda n: n, rank=0,
            world_size=1)
    assert kept["correct"].questions == [] and kept["correct"].informative_groups == 0
    assert len(kept["reward"].questions) == 4 and all(q.index % 2 for q in kept["reward"].questions)
    check_groups(kept["reward"].trajectories, kept["reward"].questions, 2)
