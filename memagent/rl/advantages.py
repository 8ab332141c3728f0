"""Group outcome advantages, computed once per trajectory and broadcast to its conversations.

MemAgent (arXiv 2507.02259, Sec. 3 "Multi-Conv"): a trajectory is several independent conversations (one memory
update per chunk, then the final answer) but has ONE outcome reward. The G trajectories of a question form a group;
the GRPO advantage A_i = (R_i - mean_g) / (std_g + eps) is computed on the G trajectory rewards (never on rows,
which would weight mean and std by the number of conversations) and then copied to every conversation.

What this leaves out: token-level rewards, KL-in-reward and NaN rewards (rejected, not skipped).
"""

from __future__ import annotations

import torch
from torch import Tensor

_INT_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)


def check_group_ids(rewards: Tensor, group_ids: Tensor) -> None:
    """Raise ValueError unless `rewards` is a finite [N] tensor and `group_ids` an integer [N] tensor."""
    if rewards.dim() != 1:
        raise ValueError(f"rewards: expected a 1-D [N] tensor, got shape {tuple(rewards.shape)}")
    if group_ids.dim() != 1 or group_ids.shape != rewards.shape:
        raise ValueError(
            f"group_ids: expected shape {tuple(rewards.shape)} (one id per reward), got {tuple(group_ids.shape)}"
        )
    if group_ids.dtype not in _INT_DTYPES:
        raise ValueError(f"group_ids: expected an integer tensor, got dtype {group_ids.dtype}")
    if rewards.numel() and not bool(torch.isfinite(rewards.double()).all()):
        raise ValueError("rewards: expected finite values (no NaN or inf)")


def group_stats(rewards: Tensor, group_ids: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Per-trajectory group statistics, in float64.

    Args:
        rewards: [N] any real dtype, one outcome reward per trajectory.
        group_ids: [N] integer, trajectories with the same id form a group.
    Returns:
        (mean, std, size, constant), each [N] and gathered back to the trajectory: float64 group mean, float64
        unbiased group std (0 for size-1 groups), int64 group size, and bool "all rewards of the group are equal".
    """
    check_group_ids(rewards, group_ids)
    r = rewards.detach().double()
    _, inverse = torch.unique(group_ids, return_inverse=True)
    num_groups = int(inverse.max()) + 1 if r.numel() else 0
    size = torch.zeros(num_groups, dtype=torch.int64, device=r.device).index_add_(0, inverse, torch.ones_like(inverse))
    total = torch.zeros(num_groups, dtype=r.dtype, device=r.device).index_add_(0, inverse, r)
    mean = (total / size)[inverse]
    centered = r - mean
    sq = torch.zeros(num_groups, dtype=r.dtype, device=r.device).index_add_(0, inverse, centered * centered)
    # Unbiased (Bessel) variance, as torch.std / verl; a size-1 group has no spread, so 0 instead of 0/0.
    var = torch.where(size > 1, sq / (size - 1).clamp(min=1), torch.zeros_like(sq))
    # Exact equality test on the raw values: a float mean of identical rewards can be off by one ulp, which
    # std-normalization would blow up to a same-sign advantage for the whole group (docs/rl-math.md §7).
    hi = torch.full((num_groups,), -torch.inf, dtype=r.dtype, device=r.device).scatter_reduce(0, inverse, r, "amax")
    lo = torch.full((num_groups,), torch.inf, dtype=r.dtype, device=r.device).scatter_reduce(0, inverse, r, "amin")
    constant = (hi == lo)[inverse]
    return mean, var.sqrt()[inverse], size[inverse], constant


def group_advantages(rewards: Tensor, group_ids: Tensor, *, scale_by_std: bool = True, eps: float = 1e-6) -> Tensor:
    """GRPO outcome advantage per trajectory: (R_i - mean_g) / (std_g + eps), or R_i - mean_g (Dr. GRPO).

    Args:
        rewards: [N] real dtype, one outcome reward per trajectory.
        group_ids: [N] integer; trajectories of the same question share an id (any values, any order).
        scale_by_std: divide by the unbiased group std + eps (GRPO/DAPO); False keeps the mean-only baseline
            (Dr. GRPO, MemAgent's released setting).
        eps: added to the std; must be >= 0.
    Returns:
        [N] advantages in rewards' dtype (float32 for integer rewards). A group whose rewards are all exactly
        equal, including a group of size 1, gets exactly 0.
    """
    if eps < 0:
        raise ValueError(f"eps: expected >= 0, got {eps}")
    mean, std, _, constant = group_stats(rewards, group_ids)
    adv = rewards.detach().double() - mean
    if scale_by_std:
        adv = adv / (std + eps)
    adv = torch.where(constant, torch.zeros_like(adv), adv)
    out_dtype = rewards.dtype if rewards.is_floating_point() else torch.get_default_dtype()
    return adv.to(out_dtype)


def broadcast_to_conversations(values: Tensor, conv_traj_index: Tensor) -> Tensor:
    """Copy a per-trajectory value (the advantage) to each conversation of that trajectory.

    Args:
        values: [N, ...] per-trajectory values.
        conv_traj_index: [M] integer, the trajectory (row of `values`) each conversation belongs to.
    Returns:
        [M, ...] with row k equal to values[conv_traj_index[k]].
    """
    if values.dim() < 1:
        raise ValueError(f"values: expected at least one dimension [N, ...], got shape {tuple(values.shape)}")
    if conv_traj_index.dim() != 1 or conv_traj_index.dtype not in _INT_DTYPES:
        raise ValueError(
            f"conv_traj_index: expected a 1-D integer [M] tensor, got shape {tuple(conv_traj_index.shape)} "
            f"dtype {conv_traj_index.dtype}"
        )
    n = values.shape[0]
    if conv_traj_index.numel() and (int(conv_traj_index.min()) < 0 or int(conv_traj_index.max()) >= n):
        raise ValueError(f"conv_traj_index: expected trajectory indices in [0, {n}), got values outside it")
    return values[conv_traj_index.long()]
