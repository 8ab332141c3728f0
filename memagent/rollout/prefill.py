"""Prefill for the generation engine: left padding, chunked forwards, and sharing the work prompts have in common.

A MemAgent group rollout sends the engine many prompts that overlap (docs/workflow.md):
- in round 1 the G trajectories of a question send the *same* prompt (same question, initial memory and chunk);
- in later rounds the G prompts of a group agree up to the memory: chat template, instruction and problem come
  first, then each trajectory's own memory, then the chunk. For SmolLM2 at chunk 256 that common prefix is 159 of
  454 tokens of a memory round and 116 of ~140 of the answer round.

`prefill_prompts` therefore does three things:
1. Identical prompts are prefilled once (`share_prefill`), then their KV cache is copied to each of their rows.
2. Among the distinct prompts, runs that share a long common prefix (`min_shared_prefix` tokens or more) prefill
   that prefix once; its cache is copied to the run's rows and only the suffixes are prefilled after it, behind
   middle padding: a row's positions are [pads][prefix][pads][suffix], attention mask 0 on pads, position ids
   cumsum(mask) - 1, so every real token sits at the position it has in a plain prefill and attends to exactly the
   tokens it would there. Which prompts form a run is chosen to maximise the tokens saved (`shared_prefix_runs`):
   all prompts of a round share the chat template, a group shares the problem too, and the larger saving wins.
3. Every forward goes through the cache in slices of `chunk` positions (chunked prefill), so a slice's activations,
   not a whole prompt's, are live at once.
Results equal a plain left-padded prefill up to float rounding of the different batch shapes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor
from transformers import DynamicCache


@dataclass
class Prefilled:
    """The state the decode loop starts from, one row per prompt, in input order."""

    logits: Tensor
    """[B, V] logits of each prompt's last position (the model's dtype)."""
    mask: Tensor
    """[B, W] long attention mask over the cache positions, 1 = a real prompt token."""
    last_positions: Tensor
    """[B, 1] long position id of each prompt's last token."""
    cache: DynamicCache
    """W positions per row."""


def left_pad(prompts: list[list[int]], pad_token_id: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """Left-pad prompts. Returns input ids [B, T] long and attention mask [B, T] long (0 on pads)."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
        mask[row, width - len(prompt) :] = 1
    return ids.to(device), mask.to(device)


def distinct_prompts(prompts: list[list[int]]) -> tuple[list[list[int]], list[int]]:
    """Deduplicate prompts, keeping first occurrences in order.

    Returns (distinct, inverse): distinct[inverse[i]] == prompts[i] for every i, len(distinct) <= len(prompts).
    """
    index: dict[tuple[int, ...], int] = {}
    distinct: list[list[int]] = []
    inverse: list[int] = []
    for prompt in prompts:
        key = tuple(prompt)
        if key not in index:
            index[key] = len(distinct)
            distinct.append(prompt)
        inverse.append(index[key])
    return distinct, inverse


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def shared_prefix_runs(prompts: list[list[int]], min_shared_prefix: int) -> list[tuple[list[int], int]]:
    """Groups of prompts to prefill behind one shared prefix, chosen to save the most prefill tokens.

    prompts: distinct token-id lists. Returns (rows, prefix_len) per group of two or more rows, prefix_len >=
    min_shared_prefix; rows in no group are absent. Each prefix leaves every row of its group at least one token of
    its own, so every row has a last position to prefill. Method: sort the prompts; a run of neighbours then has
    as common prefix the smallest common prefix of adjacent ones, and a dynamic program over the cuts of the sorted
    list maximises the saving, sum over runs of (size - 1) * prefix_len, in O(B^2). On a MemAgent round it saves at
    least what grouping by question (template + problem) or one run of all (the template) saves. Groupings of
    non-neighbours, which can save a little more (two prompts sharing a short prefix around a run sharing a longer
    one), are not searched.
    """
    order = sorted(range(len(prompts)), key=lambda i: prompts[i])
    n = len(order)
    neighbour = [0] + [_common_prefix(prompts[order[k - 1]], prompts[order[k]]) for k in range(1, n)]
    best = [0] * (n + 1)  # best[j]: the largest saving over the first j sorted prompts
    start = list(range(n + 1))  # start[j]: where the last run of that best partition begins
    for j in range(1, n + 1):
        best[j], start[j] = best[j - 1], j - 1  # prompt j - 1 alone
        prefix, shortest = None, len(prompts[order[j - 1]])
        for i in range(j - 2, -1, -1):  # the run order[i : j]
            prefix = neighbour[i + 1] if prefix is None else min(prefix, neighbour[i + 1])
            shortest = min(shortest, len(prompts[order[i]]))
            usable = min(prefix, shortest - 1)
            if usable < min_shared_prefix:
                break  # a longer run only lowers the common prefix and the shortest prompt
            saving = best[i] + (j - i - 1) * usable
            if saving > best[j]:
                best[j], start[j] = saving, i
    runs: list[tuple[list[int], int]] = []
    j = n
    while j > 0:
        i = start[j]
        if j - i >= 2:
            rows = [order[k] for k in range(i, j)]
            prefix = min(neighbour[k] for k in range(i + 1, j))
            runs.append((rows, min(prefix, min(len(prompts[r]) for r in rows) - 1)))
        j = i
    return runs[::-1]


def forward_through_cache(
    model: torch.nn.Module, input_ids: Tensor, mask: Tensor, positions: Tensor, cache: DynamicCache, chunk: int
) -> Tensor:
    """Append input_ids to the cache in slices of `chunk` positions; return the last position's logits.

    input_ids, positions: [b, T] long; mask: [b, P + T] long over the P positions already cached and the T new
    ones. Returns [b, V] logits in the model's dtype.
    """
    cached = mask.shape[1] - input_ids.shape[1]
    width = input_ids.shape[1]
    chunk = chunk or width
    for start in range(0, width, chunk):
        end = min(start + chunk, width)
        out = model(
            input_ids=input_ids[:, start:end],
            attention_mask=mask[:, : cached + end],
            position_ids=positions[:, start:end],
            cache=cache,
            use_cache=True,
            logits_to_keep=1,
        )
    return out.logits[:, -1, :]


def _positions(mask: Tensor) -> Tensor:
    return (mask.cumsum(-1) - 1).clamp_(min=0)


def prefill_prompts(
    model: torch.nn.Module,
    prompts: list[list[int]],
    *,
    pad_token_id: int,
    chunk: int,
    new_cache,
    share_prefill: bool,
    min_shared_prefix: int,
) -> Prefilled:
    """Prefill `prompts` (B non-empty token-id lists) into a fresh cache; see the module docstring.

    new_cache(width) -> DynamicCache builds the cache once the padded width W is known (the engine preallocates
    W + max_new_tokens). chunk: positions per forward (0 = one forward). share_prefill: prefill identical prompts
    once and, when min_shared_prefix > 0, common prefixes of min_shared_prefix tokens or more once.
    """
    device = next(model.parameters()).device
    distinct, inverse = distinct_prompts(prompts) if share_prefill else (prompts, None)
    runs = shared_prefix_runs(distinct, min_shared_prefix) if share_prefill and min_shared_prefix > 0 else []
    if not runs:
        ids, mask = left_pad(distinct, pad_token_id, device)
        cache = new_cache(ids.shape[1])
        positions = _positions(mask)
        logits = forward_through_cache(model, ids, mask, positions, cache, chunk)
    else:
        prefix_len = [0] * len(distinct)
        run_of = [0] * len(distinct)  # rows outside every run borrow run 0's prefix, fully masked out
        for r, (rows, n) in enumerate(runs):
            for row in rows:
                prefix_len[row], run_of[row] = n, r
        prefix_ids, prefix_mask = left_pad([distinct[rows[0]][:n] for rows, n in runs], pad_token_id, device)
        suffix_ids, suffix_mask = left_pad([p[n:] for p, n in zip(distinct, prefix_len)], pad_token_id, device)
        cache = new_cache(prefix_ids.shape[1] + suffix_ids.shape[1])
        forward_through_cache(model, prefix_ids, prefix_mask, _positions(prefix_mask), cache, chunk)
        expand = torch.tensor(run_of, dtype=torch.long, device=device)
        cache.reorder_cache(expand)
        has_prefix = torch.tensor([n > 0 for n in prefix_len], dtype=torch.long, device=device)[:, None]
        mask = torch.cat([prefix_mask.index_select(0, expand) * has_prefix, suffix_mask], dim=1)
        positions = _positions(mask)
        logits = forward_through_cache(
            model, suffix_ids, mask, positions[:, prefix_ids.shape[1] :], cache, chunk
        )
    if inverse is not None and len(distinct) < len(prompts):
        # One row per prompt again: each copy of a prompt's KV is then extended by its own sampled tokens.
        expand = torch.tensor(inverse, dtype=torch.long, device=device)
        cache.reorder_cache(expand)
        logits, mask, positions = (t.index_select(0, expand) for t in (logits, mask, positions))
    return Prefilled(logits=logits, mask=mask, last_positions=positions[:, -1:], cache=cache)
