"""Step 2's reward record: verifier score and overlong penalty kept apart; dynamic sampling keys on correctness."""

from __future__ import annotations

import pytest
import torch

from memagent.records import ANSWER, Conversation, Sample, Trajectory
from memagent.rl.dynamic_sampling import QuestionStream, collect_groups
from memagent.rl.rewards import score_trajectories


def trajectory(answer: str, answer_tokens: int, index: int = 0, error: str | None = None) -> Trajectory:
    final = Conversation([1], [5] * answer_tokens, [1] * answer_tokens, torch.zeros(answer_tokens), True, ANSWER,
                         -1, answer)
    return Trajectory(sample_index=index, conversations=[final], answer=answer, error=error)


SAMPLES = [Sample(context="", question="q", answers=["4285066"])]
SHAPING = dict(answer_budget=8, overlong_shaping=True, overlong_cache_tokens=4, overlong_factor=1.0)


def test_lenient_verifier_credits_an_unboxed_answer_that_strict_does_not() -> None:
    strict, lenient = [trajectory("The number is 4285066.", 2)], [trajectory("The number is 4285066.", 2)]
    score_trajectories(strict, SAMPLES, verifier="strict", **SHAPING)
    score_trajectories(lenient, SAMPLES, verifier="lenient", **SHAPING)
    assert strict[0].reward.correct == 0.0 and lenient[0].reward.correct == 1.0


@pytest.mark.parametrize("answer", ["4", "428", "The number is 42", "", "The.", "\\boxed{5066}"])
def test_lenient_training_verifier_pays_nothing_for_a_fragment_of_the_gold(answer) -> None:
    """A training reward that credits an answer contained in the gold is hacked: seed 0 of the SmolLM2 run learned
    to answer one digit of the number (docs/evaluation.md). Only an answer that contains a gold earns credit."""
    scored = [trajectory(answer, 2)]
    score_trajectories(scored, SAMPLES, verifier="lenient", **SHAPING)
    assert scored[0].reward.correct == 0.0


@pytest.mark.parametrize("answer", ["4285066", "The special magic number is 4285066.", "\\boxed{ 4285066 }",
                                    "Therefore, the answer is **4285066**."])
def test_lenient_training_verifier_pays_for_an_answer_that_contains_the_gold(answer) -> None:
    scored = [trajectory(answer, 2)]
    score_trajectories(scored, SAMPLES, verifier="lenient", **SHAPING)
    assert scored[0].reward.correct == 1.0


def test_overlong_penalty_is_kept_apart_from_correctness_and_ramps_over_the_cache() -> None:
    trajs = [trajectory("\\boxed{4285066}", n) for n in (4, 6, 8)]
    score_trajectories(trajs, SAMPLES, verifier="strict", **SHAPING)
    assert [t.reward.correct for t in trajs] == [1.0, 1.0, 1.0]
    assert [t.reward.overlong for t in trajs] == pytest.approx([0.0, -0.5, -1.0])
    assert [t.reward.total for t in trajs] == pytest.approx([1.0, 0.5, 0.0])


def test_a_failed_request_scores_as_a_wrong_answer() -> None:
    trajs = [trajectory("\\boxed{4285066}", 2, error="timeout")]
    score_trajectories(trajs, SAMPLES, verifier="strict", **SHAPING)
    assert trajs[0].reward.correct == 0.0


def test_unknown_verifier_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="verifier='fuzzy'"):
        score_trajectories([], SAMPLES, verifier="fuzzy", **SHAPING)


def test_dynamic_sampling_drops_a_group_whose_totals_differ_but_correctness_does_not() -> None:
    """All G answers right, lengths 4 and 8: totals 1 and 0 differ, correctness does not, so the group goes (DAPO
    filters on accuracy), while a group with one wrong answer is kept."""
    samples = [Sample(context="", question=f"q{i}", answers=["4285066"], index=i) for i in range(2)]

    def rollout(qs: list[Sample]) -> list[Trajectory]:
        out = []
        for position, q in enumerate(qs):
            wrong = "\\boxed{1}" if q.index == 1 else "\\boxed{4285066}"
            out += [trajectory("\\boxed{4285066}", 4, position), trajectory(wrong, 8, position)]
        return out

    got = collect_groups(QuestionStream(2, 0), samples, 2, rollout=rollout,
                         score=lambda t, q: score_trajectories(t, q, verifier="strict", **SHAPING),
                         max_over_ranks=lambda n: n, rank=0, world_size=1, dynamic_sampling=True,
                         max_refill_rounds=0, refill_oversample_cap=1.0, refill_margin_std=0.5)
    assert [q.index for q in got.questions] == [1]
    assert len(got.generated) == 4


MIX = [Sample(context="", question="q", answers=["1111", "2222", "3333", "4444"], task="niah_multivalue"),
       Sample(context="", question="q", answers=["Tanoia"], task="hotpotqa_synth")]


def test_task_verifier_gives_partial_credit_to_a_multi_value_answer_and_whole_credit_to_qa() -> None:
    """rollout.verifier=task: string_match_all for RULER-style tasks (two of four values: 0.5), the contained rule
    for QA-like tasks (the gold inside the answer: 1.0; a fragment of it: 0.0)."""
    scored = [trajectory("The numbers are 1111 and 3333.", 2, index=0), trajectory("She lives in Tanoia.", 2, index=1),
              trajectory("Tan", 2, index=1)]
    score_trajectories(scored, MIX, verifier="task", **SHAPING)
    assert [t.reward.correct for t in scored] == [0.5, 1.0, 0.0]


def test_a_partial_credit_group_is_informative_only_when_its_scores_differ() -> None:
    """Dynamic sampling drops a group whose G scores are all equal, 0.5 each included, and keeps one whose
    partial scores differ."""
    answers = {0: ["1111 2222", "3333 4444"], 1: ["1111 2222", "1111 2222 3333"]}  # equal / unequal partial scores
    samples = [MIX[0], MIX[0]]

    def rollout(questions: list[Sample]) -> list[Trajectory]:
        return [trajectory(a, 2, index=q) for q in range(len(questions)) for a in answers[q]]

    with pytest.warns(UserWarning, match="lacks 1 of 2 informative groups"):
        kept = collect_groups(
            QuestionStream(2, seed=0), samples, 2, rollout=rollout,
            score=lambda trajs, qs: score_trajectories(trajs, qs, verifier="task", **SHAPING),
            max_over_ranks=lambda k: k, rank=0, world_size=1, dynamic_sampling=True, max_refill_rounds=0,
            refill_oversample_cap=1.0, refill_margin_std=0.0)
    assert [t.reward.correct for t in kept.generated] == [0.5, 0.5, 0.5, 0.75]
    assert kept.informative_groups == 1 and [t.answer for t in kept.trajectories] == answers[1]
    assert kept.generated_tasks == ["niah_multivalue"] * 4
