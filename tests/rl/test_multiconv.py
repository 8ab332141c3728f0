"""Multi-conversation trajectories (MemAgent's Multi-Conv): docs/rl-math.md §6 property 25.

One reward per trajectory, one group advantage per trajectory, copied to each of its K_i conversation rows.
"""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st

from memagent.rl import broadcast_to_conversations, group_advantages, policy_loss

from .batches import FAST, grad_of


@st.composite
def trajectories(draw: st.DrawFn):
    """Groups of trajectories, each with 1-4 conversations of 1-4 tokens, and per-token log-probs."""
    groups = draw(st.integers(1, 3))
    size = draw(st.integers(2, 4))
    n = groups * size
    rewards = torch.tensor(draw(st.lists(st.integers(0, 3), min_size=n, max_size=n)), dtype=torch.float64)
    group_ids = torch.arange(n) // size
    lengths = [draw(st.lists(st.integers(1, 4), min_size=1, max_size=4)) for _ in range(n)]
    seed = draw(st.integers(0, 2**31 - 1))
    return rewards, group_ids, lengths, seed


def _rows(lengths: list[list[int]]) -> torch.Tensor:
    """[M] trajectory index of each conversation row, in trajectory order."""
    return torch.tensor([i for i, convs in enumerate(lengths) for _ in convs])


@FAST
@given(trajectories(), st.booleans())
def test_every_conversation_of_a_trajectory_gets_the_same_advantage(data, scale_by_std):
    rewards, group_ids, lengths, seed = data
    traj_adv = group_advantages(rewards, group_ids, scale_by_std=scale_by_std)
    index = _rows(lengths)
    shuffled = index[torch.randperm(len(index), generator=torch.Generator().manual_seed(seed))]
    conv_adv = broadcast_to_conversations(traj_adv, shuffled)
    for i in range(len(rewards)):
        assert bool((conv_adv[shuffled == i] == traj_adv[i]).all())


@FAST
@given(trajectories(), st.lists(st.integers(1, 5), min_size=12, max_size=12))
def test_advantage_invariant_to_splitting_a_trajectory_into_more_rows(data, more):
    rewards, group_ids, lengths, _ = data
    traj_adv = group_advantages(rewards, group_ids)
    split = [[1] * (len(c) + k) for c, k in zip(lengths, more)]
    few_index, many_index = _rows(lengths), _rows(split)
    few = broadcast_to_conversations(traj_adv, few_index)
    many = broadcast_to_conversations(traj_adv, many_index)
    for i in range(len(rewards)):
        assert few[few_index == i].unique().tolist() == many[many_index == i].unique().tolist() == [float(traj_adv[i])]


def test_per_row_grpo_with_repeated_group_ids_differs_from_per_trajectory():
    # The pitfall of docs/rl-math.md §1: normalizing over rows weights mean and std by K_i.
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=torch.float64)
    group_ids = torch.zeros(4, dtype=torch.long)
    index = torch.tensor([0, 0, 0, 1, 2, 3])  # the correct trajectory has 3 conversations
    right = broadcast_to_conversations(group_advantages(rewards, group_ids), index)
    wrong = group_advantages(rewards[index], group_ids[index])
    assert torch.allclose(right[0], torch.tensor(1.5, dtype=torch.float64), atol=1e-5)
    assert not torch.allclose(wrong, right, atol=1e-3)


@FAST
@given(trajectories(), st.sampled_from([None, 3.0]))
def test_broadcast_then_token_mean_equals_concatenating_the_conversations(data, clip_c):
    rewards, group_ids, lengths, seed = data
    g = torch.Generator().manual_seed(seed)
    total = sum(map(sum, lengths))
    logp_flat = -2.0 * torch.rand(total, generator=g, dtype=torch.float64)
    old_flat = logp_flat + (2.0 * torch.rand(total, generator=g, dtype=torch.float64) - 1.0)
    traj_adv = group_advantages(rewards, group_ids)
    convs = [(i, n) for i, c in enumerate(lengths) for n in c]

    # Rows = conversations (what the trainer does) and rows = whole trajectories (one concatenated sequence).
    row_pos, cat_pos = [], []
    for k, (i, n) in enumerate(convs):
        offset = sum(m for j, m in convs[:k] if j == i)
        row_pos += [(k, t) for t in range(n)]
        cat_pos += [(i, offset + t) for t in range(n)]

    def layout(positions, shape):
        logp = torch.zeros(shape, dtype=torch.float64)
        old = torch.zeros(shape, dtype=torch.float64)
        mask = torch.zeros(shape, dtype=torch.float64)
        for f, (r, t) in enumerate(positions):
            logp[r, t], old[r, t], mask[r, t] = logp_flat[f], old_flat[f], 1.0
        return logp.requires_grad_(True), old, mask

    rows = layout(row_pos, (len(convs), max(n for _, n in convs)))
    cat = layout(cat_pos, (len(lengths), max(map(sum, lengths))))
    row_adv = broadcast_to_conversations(traj_adv, torch.tensor([i for i, _ in convs]))
    row_loss, _ = policy_loss(*rows[:2], row_adv, rows[2], clip_c=clip_c)
    cat_loss, _ = policy_loss(*cat[:2], traj_adv, cat[2], clip_c=clip_c)
    assert torch.allclose(row_loss, cat_loss, rtol=1e-12, atol=1e-15)
    row_grad, cat_grad = grad_of(row_loss, rows[0]), grad_of(cat_loss, cat[0])
    for (r, t), (i, u) in zip(row_pos, cat_pos):
        assert torch.isclose(row_grad[r, t], cat_grad[i, u], rtol=1e-12, atol=1e-15)
