"""Step 4 of an RL step: one group advantage per trajectory, broadcast to every conversation as training rows.

Multi-Conv DAPO (paper Sec. 3): the G trajectories of a question form a group; A_i = (R_i - mean) / (std + eps)
(or R_i - mean) is computed once per trajectory from its total reward, and every conversation of trajectory i (its
memory updates and its answer) becomes a row with advantage A_i (docs/rl-math.md §1).
"""

from __future__ import annotations

import torch

from memagent.records import TrainRow, Trajectory
from memagent.rl.advantages import broadcast_to_conversations, group_advantages


def trajectories_to_rows(trajectories: list[Trajectory], *, scale_by_std: bool, eps: float) -> list[TrainRow]:
    """One row per conversation, in trajectory order; groups are the trajectories' `sample_index`.

    Every trajectory must have been scored (memagent.rl.rewards.score_trajectories).
    """
    if not trajectories:
        return []
    if any(t.reward is None for t in trajectories):
        raise ValueError("trajectories_to_rows: every trajectory needs a reward; score them first")
    rewards = torch.tensor([t.reward.total for t in trajectories], dtype=torch.float64)  # [N]
    groups = torch.tensor([t.sample_index for t in trajectories])  # [N]
    adv = group_advantages(rewards, groups, scale_by_std=scale_by_std, eps=eps)  # [N], once per trajectory
    conv_traj = torch.tensor([i for i, t in enumerate(trajectories) for _ in t.conversations])  # [M]
    conv_adv = broadcast_to_conversations(adv, conv_traj)  # [M]
    convs = [c for t in trajectories for c in t.conversations]
    return [TrainRow.from_conversation(c, float(a)) for c, a in zip(convs, conv_adv.tolist())]
