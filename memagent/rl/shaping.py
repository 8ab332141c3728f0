"""DAPO reward shaping and dynamic-sampling filter (arXiv 2503.14476, Sec. 3.2 and 3.4).

overlong_penalty: the soft length penalty added to the correctness reward,
    0                                   for L <= max_len - cache_len
    ((max_len - cache_len) - L) / cache_len * factor   in between (linear, continuous at both ends)
    -factor                             for L >= max_len
keep_informative_groups: dynamic sampling keeps a question only if its G rewards are not all equal; a group with
zero reward variance has zero advantage everywhere, so it adds no gradient and only dilutes the normalizer.
Refilling the batch with new groups is the trainer's job.
"""

from __future__ import annotations

import torch
from torch import Tensor

from memagent.rl.advantages import group_stats


def overlong_penalty(lengths: Tensor, *, max_len: int, cache_len: int, factor: float = 1.0) -> Tensor:
    """Soft overlong penalty per response, never positive.

    Args:
        lengths: [N] integer or float, response lengths in tokens (>= 0).
        max_len: L_max, the generation cap (> 0).
        cache_len: L_cache, the width of the linear band (0 < cache_len <= max_len).
        factor: penalty at L >= max_len is -factor (>= 0).
    Returns:
        [N] penalties in [-factor, 0], float (lengths' dtype if float, else the default float dtype).
    """
    if lengths.dim() != 1:
        raise ValueError(f"lengths: expected a 1-D [N] tensor, got shape {tuple(lengths.shape)}")
    if lengths.numel() and bool((lengths < 0).any()):
        raise ValueError("lengths: expected non-negative lengths, got a negative value")
    if not max_len > 0:
        raise ValueError(f"max_len: expected > 0, got {max_len}")
    if not 0 < cache_len <= max_len:
        raise ValueError(f"cache_len: expected 0 < cache_len <= max_len ({max_len}), got {cache_len}")
    if not factor >= 0:
        raise ValueError(f"factor: expected >= 0, got {factor}")
    frac = ((max_len - cache_len) - lengths.double()) / cache_len
    out = frac.clamp(-1.0, 0.0) * factor
    return out.to(lengths.dtype if lengths.is_floating_point() else torch.get_default_dtype())


def keep_informative_groups(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """Dynamic-sampling keep mask: True for every trajectory of a group whose rewards are not all equal.

    Args:
        rewards: [N] real dtype, one outcome reward per trajectory.
        group_ids: [N] integer group (question) ids.
    Returns:
        [N] bool, constant within each group; groups of size 1 are not informative (False).
    """
    _, _, _, constant = group_stats(rewards, group_ids)
    return ~constant
