"""DAPO reward shaping and dynamic-sampling filter (arXiv 2503.14476, Sec. 3.2 and 3.4).

overlong_penalty: the soft length penalty added to the correctness reward,
    0                                   for L <= max_len - cache_len
    ((max_len - cache_len) - L) / cache_len * factor   in between (linear, continuous at both ends)
    -factor                             for L >= max_len
read_cost_penalty: gated memory's optional efficiency term (docs/gates.md; not DAPO's), added like the overlong
penalty: -cost * chunks_read / document_chunks, so a trajectory that the exit gate stopped early pays less.
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


def _share_cost(used: Tensor, most: Tensor, name: str, *, cost: float) -> Tensor:
    """-cost x min(1, used / most) per trajectory, 0 where most is 0: the form both efficiency terms share.

    Args:
        used: [N] integer or float counts (>= 0); `name` names it in errors.
        most: [N] float64, the most a trajectory could use (>= 0).
        cost: >= 0, the penalty of using the most.
    Returns:
        [N] penalties in [-cost, 0], float (used's dtype if float, else the default float dtype).
    """
    if used.numel() and bool((used < 0).any()):
        raise ValueError(f"{name}: expected non-negative counts, got a negative value")
    if not cost >= 0:
        raise ValueError(f"cost: expected >= 0, got {cost}")
    spent = used.double()
    share = torch.where(most > 0, (spent / most.clamp(min=1.0)).clamp(max=1.0), torch.zeros_like(spent))
    out = -cost * share
    return out.to(used.dtype if used.is_floating_point() else torch.get_default_dtype())


def _check_pair(counts: Tensor, document_chunks: Tensor, name: str) -> None:
    if counts.dim() != 1 or counts.shape != document_chunks.shape:
        raise ValueError(f"{name} and document_chunks: expected two [N] tensors, got shapes "
                         f"{tuple(counts.shape)} and {tuple(document_chunks.shape)}")


def read_cost_penalty(chunks_read: Tensor, document_chunks: Tensor, *, cost: float) -> Tensor:
    """Efficiency term per trajectory, never positive: -cost x the share of the document's chunks it read.

    Args:
        chunks_read: [N] integer or float, chunks each trajectory read (>= 0).
        document_chunks: [N] same kind, chunks of its document (>= chunks_read); 0 (an empty document) gives 0.
        cost: lambda >= 0, the penalty of reading the whole document.
    Returns:
        [N] penalties in [-cost, 0], float (chunks_read's dtype if float, else the default float dtype).
    """
    _check_pair(chunks_read, document_chunks, "chunks_read")
    if bool((chunks_read > document_chunks).any()):
        raise ValueError("chunks_read: a trajectory read more chunks than its document_chunks")
    return _share_cost(chunks_read, document_chunks.double(), "chunks_read", cost=cost)


def write_cost_penalty(memory_tokens: Tensor, document_chunks: Tensor, *, memory_budget: int, cost: float) -> Tensor:
    """Efficiency term per trajectory, never positive: -cost x the memory tokens it wrote over the most a reader of
    the whole document may write (memory_budget per chunk), capped at the whole cost.

    It pays for what MemAgent spends every chunk, a memory rewrite: a KEEP or an early exit writes nothing, an
    UPDATE its memory's tokens (docs/gates.md, "Reward"). An unparsed gated response writes its decision line as
    memory too, so a share above 1 is possible and is capped.

    Args:
        memory_tokens: [N] integer or float, tokens each trajectory wrote to memory (>= 0; decision tokens excluded,
            Trajectory.memory_tokens_generated).
        document_chunks: [N] same kind, chunks of its document; 0 (an empty document) gives 0.
        memory_budget: tokens one memory update may write (workflow.memory_tokens), >= 1.
        cost: mu >= 0, the penalty of writing a full memory after every chunk of the document.
    Returns:
        [N] penalties in [-cost, 0], float (memory_tokens' dtype if float, else the default float dtype).
    """
    _check_pair(memory_tokens, document_chunks, "memory_tokens")
    if memory_budget < 1:
        raise ValueError(f"memory_budget: expected >= 1, got {memory_budget}")
    return _share_cost(memory_tokens, document_chunks.double() * memory_budget, "memory_tokens", cost=cost)


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
