"""Gated memory changes no RL math (docs/gates.md, docs/rl-math.md §6 property 26): a KEEP round (a response of
decision tokens only), an ANSWER round that ends reading (a trajectory with fewer conversations) and an unparsed
round become rows exactly like any other conversation, and every row of a trajectory gets its group advantage.
Float64 rewards, hypothesis-drawn trajectories.
"""

from __future__ import annotations

import dataclasses

import torch
from hypothesis import given
from hypothesis import strategies as st

from memagent.records import ANSWER, MEMORY, Conversation, Reward, Trajectory
from memagent.rl import group_advantages
from memagent.rl.rows import trajectories_to_rows
from memagent.rollout.gates import ANSWER_NOW, KEEP, UNPARSED, UPDATE

from .batches import FAST

ROUNDS = ("", UPDATE, KEEP, UNPARSED)
"""A memory round's decision: "" = ungated, as MemAgent's."""


@st.composite
def conversation(draw: st.DrawFn, kind: str, decision: str, chunk: int) -> Conversation:
    """A conversation with drawn prompt and response ids and float32 log-probs; a KEEP or ANSWER round's response is
    its 1-3 decision tokens (the engine stopped after the word), an UPDATE's opens with 1-2 of them."""
    prompt = draw(st.lists(st.integers(3, 500), min_size=1, max_size=6))
    short = decision in (KEEP, ANSWER_NOW)
    response = draw(st.lists(st.integers(3, 500), min_size=1, max_size=3 if short else 6))
    spent = len(response) if short else min(len(response), draw(st.integers(1, 2))) if decision == UPDATE else 0
    logprobs = -torch.tensor(draw(st.lists(st.floats(0.0, 8.0), min_size=len(response), max_size=len(response))),
                             dtype=torch.float32)
    return Conversation(prompt, response, [1] * len(response), logprobs, finished=True, kind=kind, chunk_index=chunk,
                        text="m", decision=decision, decision_tokens=spent)


@st.composite
def trajectory(draw: st.DrawFn, index: int) -> Trajectory:
    """0-4 memory rounds, maybe ended by ANSWER (the exit gate), then the answer; a float64-exact drawn reward."""
    decisions = draw(st.lists(st.sampled_from(ROUNDS), min_size=0, max_size=4))
    exited = draw(st.booleans())
    if exited:
        decisions.append(ANSWER_NOW)
    rounds = [draw(conversation(MEMORY, d, k)) for k, d in enumerate(decisions)]
    final = draw(conversation(ANSWER, "", -1))
    whole = len(rounds) + (draw(st.integers(0, 3)) if exited else 0)
    reward = Reward(correct=draw(st.sampled_from([0.0, 0.5, 1.0])), overlong=-draw(st.floats(0.0, 1.0)),
                    read_cost=-draw(st.floats(0.0, 0.5)))
    return Trajectory(sample_index=index, conversations=[*rounds, final], num_chunks=len(rounds),
                      document_chunks=whole, reward=reward)


@st.composite
def groups(draw: st.DrawFn) -> list[Trajectory]:
    count, size = draw(st.integers(1, 3)), draw(st.integers(2, 4))
    return [draw(trajectory(g)) for g in range(count) for _ in range(size)]


def _expected_advantages(trajectories: list[Trajectory], scale_by_std: bool) -> list[float]:
    rewards = torch.tensor([t.reward.total for t in trajectories], dtype=torch.float64)
    ids = torch.tensor([t.sample_index for t in trajectories])
    return group_advantages(rewards, ids, scale_by_std=scale_by_std).tolist()


def _ungated(t: Trajectory) -> Trajectory:
    """The same tokens with every decision label removed, as MemAgent would record them."""
    plain = [dataclasses.replace(c, decision="", decision_tokens=0) for c in t.conversations]
    return dataclasses.replace(t, conversations=plain)


@FAST
@given(groups(), st.booleans())
def test_every_round_is_a_row_of_its_sampled_tokens_with_its_trajectorys_advantage(trajectories, scale_by_std):
    rows = trajectories_to_rows(trajectories, scale_by_std=scale_by_std, eps=1e-6, reuse_logprobs=True)
    advantages = _expected_advantages(trajectories, scale_by_std)
    pairs = [(c, a) for t, a in zip(trajectories, advantages) for c in t.conversations]
    assert len(rows) == len(pairs)
    for row, (c, a) in zip(rows, pairs):
        assert row.input_ids == c.prompt_ids + c.response_ids and row.prompt_len == len(c.prompt_ids)
        assert row.response_mask == [1] * len(c.response_ids)  # a KEEP's decision tokens are trained, nothing more
        assert row.advantage == a
        assert torch.equal(row.old_logprobs, c.logprobs)


@FAST
@given(groups(), st.booleans())
def test_rows_do_not_see_the_decisions(trajectories, scale_by_std):
    gated = trajectories_to_rows(trajectories, scale_by_std=scale_by_std, eps=1e-6, reuse_logprobs=True)
    plain = trajectories_to_rows([_ungated(t) for t in trajectories], scale_by_std=scale_by_std, eps=1e-6,
                                 reuse_logprobs=True)
    for a, b in zip(gated, plain, strict=True):
        assert (a.input_ids, a.prompt_len, a.response_mask, a.advantage) == (b.input_ids, b.prompt_len,
                                                                             b.response_mask, b.advantage)
        assert torch.equal(a.old_logprobs, b.old_logprobs)


@FAST
@given(groups(), st.data())
def test_an_early_exit_changes_no_advantage_only_the_number_of_rows(trajectories, data):
    """Reading the rest of the document (more UPDATE rounds, same reward) leaves every advantage as it was."""
    longer = []
    for t in trajectories:
        extra = [data.draw(conversation(MEMORY, UPDATE, t.num_chunks + k)) for k in range(data.draw(st.integers(0, 3)))]
        longer.append(dataclasses.replace(t, conversations=[*t.conversations[:-1], *extra, t.conversations[-1]]))
    short = trajectories_to_rows(trajectories, scale_by_std=True, eps=1e-6)
    long = trajectories_to_rows(longer, scale_by_std=True, eps=1e-6)
    per_traj = lambda rows, trajs: [  # noqa: E731
        {rows[sum(len(u.conversations) for u in trajs[:i]) + j].advantage for j in range(len(t.conversations))}
        for i, t in enumerate(trajs)]
    assert per_traj(short, trajectories) == per_traj(long, longer) == [{a} for a in _expected_advantages(
        trajectories, True)]
