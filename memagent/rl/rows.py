"""Step 4 of an RL step: one group advantage per trajectory, broadcast to every conversation as training rows.

Multi-Conv DAPO (paper Sec. 3): the G trajectories of a question form a group; A_i = (R_i - mean) / (std + eps)
(or R_i - mean) is computed once per trajectory from its total reward, and every conversation of trajectory i (its
memory updates and its answer) becomes a row with advantage A_i (docs/rl-math.md §1).
"""

from __future__ import annotations

import torch

from memagent.records import TrainRow, Trajectory
from memagent.rl.advantages import broadcast_to_conversations, group_advantages


def trajectories_to_rows(
    trajectories: list[Trajectory], *, scale_by_std: bool, eps: float, reuse_logprobs: bool = False
) -> list[TrainRow]:
    """One row per conversation, in trajectory order; groups are the trajectories' `sample_index`.

    Every trajectory must have been scored (memagent.rl.rewards.score_trajectories). reuse_logprobs: each row's
    old_logprobs ([response length] float32) is the log-prob the sampler recorded for each token, so step 5 need not
    recompute it. That is the old policy's log-prob only when the rollout sampled from the same distribution the loss
    scores (same weights and temperature, no top-p / top-k truncation); it then differs from a recomputation by the
    rounding of another batch shape (docs/training.md, "Reusing the rollout's log-probs").
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
    rows = [TrainRow.from_conversation(c, float(a)) for c, a in zip(convs, conv_adv.tolist())]
    if reuse_logprobs:
        for row, conversation in zip(rows, convs):
            if conversation.logprobs.shape != (len(row.response_mask),):
                raise ValueError("trajectories_to_rows: reuse_logprobs needs the sampler's log-prob of every response "
                                 f"token; a conversation has {tuple(conversation.logprobs.shape)} for "
                                 f"{len(row.response_mask)} tokens (an HTTP backend records none)")
            row.old_logprobs = conversation.logprobs.float()
    return rows
