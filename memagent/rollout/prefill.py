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
   all prompts of a round share the chat template, a group shares the problem too, and the larger saving wins;
   only plans whose middle padding keeps every row within the longest prompt are considered, so the cache is
   never wider than a plain prefill's, the width a KV budget assumes (`LocalLLM.rows_per_call`; docs/training.md,
   "Generation memory").
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
    """W positions per row, W <= the longest prompt."""


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


def _runs_within(
    lengths: list[int], neighbour: list[int], min_shared_prefix: int, widest: int, cap: int
) -> tuple[int, list[tuple[int, int, int]]]:
    """The best runs of the sorted prompts whose prefixes are at most `cap` tokens and whose suffixes fit in the
    `widest - cap` positions left; returns (saving, [(first, end, prefix_len)]) in sorted indices."""
    n = len(lengths)
    room = widest - cap
    best = [0] * (n + 1)  # best[j]: the largest saving over the first j sorted prompts
    start = list(range(n + 1))  # start[j]: where the last run of that best partition begins
    shared = [0] * (n + 1)  # shared[j]: the prefix of that last run
    for j in range(1, n + 1):
        best[j], start[j] = best[j - 1], j - 1  # prompt j - 1 alone
        prefix, shortest, longest = widest, lengths[j - 1], lengths[j - 1]
        for i in range(j - 2, -1, -1):  # the run i .. j - 1
            prefix = min(prefix, neighbour[i + 1])
            shortest, longest = min(shortest, lengths[i]), max(longest, lengths[i])
            length = min(prefix, shortest - 1, cap)  # every row keeps a token of its own
            if length < min_shared_prefix or longest - length > room:
                break  # a longer run only lowers the common prefix and raises the longest suffix
            if best[i] + (j - i - 1) * length > best[j]:
                best[j], start[j], shared[j] = best[i] + (j - i - 1) * length, i, length
    runs, j = [], n
    while j > 0:
        if j - start[j] >= 2:
            runs.append((start[j], j, shared[j]))
        j = start[j]
    return best[n], runs[::-1]


def shared_prefix_runs(prompts: list[list[int]], min_shared_prefix: int) -> list[tuple[list[int], int]]:
    """Groups of prompts to prefill behind one shared prefix, chosen to save the most prefill tokens within the
    width of a plain prefill.

    prompts: distinct token-id lists. Returns (rows, prefix_len) per group of two or more rows, prefix_len >=
    min_shared_prefix; rows in no group are absent. Each prefix leaves every row of its group at least one token of
    its own, so every row has a last position to prefill.

    Width. Shared rows are laid out [pads][prefix][pads][suffix] (`split_prompts`), so the cache holds the longest
    prefix plus the longest suffix per row. Unconstrained, that reached 1204 positions for prompts of at most 609
    (4 sharing a 600-token system prompt beside an unrelated 604-token one), twice what a KV budget sized on the
    longest prompt assumed. So the plan only keeps runs whose longest prefix plus the longest suffix of any shared
    row fits the longest prompt (rows outside the runs always fit: `split_prompts`), trimming prefixes if that
    saves more than dropping runs.

    Method: sort the prompts; a run of neighbours then has as common prefix the smallest common prefix of adjacent
    ones. For a cap on the prefix length, a dynamic program over the cuts of the sorted list maximises the saving,
    sum over runs of (size - 1) * prefix_len, in O(B^2) (`_runs_within`). The best cap is a common prefix of some
    run or the cap at which some run's suffix just fits, so caps are tried from the largest down, stopping once no
    plan under a cap can beat the best found (each adjacent pair of a run saves at most min(its common prefix,
    cap)). Groupings of non-neighbours, which can save a little more (two prompts sharing a short prefix around a
    run sharing a longer one), are not searched.
    """
    order = sorted(range(len(prompts)), key=lambda i: prompts[i])
    lengths = [len(prompts[i]) for i in order]
    neighbour = [0] + [_common_prefix(prompts[order[k - 1]], prompts[order[k]]) for k in range(1, len(order))]
    widest = max(lengths, default=0)
    pairs = [min(neighbour[k], lengths[k - 1] - 1, lengths[k] - 1) for k in range(1, len(order))]
    pairs = [p for p in pairs if p >= min_shared_prefix]
    caps: set[int] = set()
    for j in range(1, len(order) + 1):
        prefix, shortest, longest = widest, lengths[j - 1], lengths[j - 1]
        for i in range(j - 2, -1, -1):
            prefix = min(prefix, neighbour[i + 1])
            shortest, longest = min(shortest, lengths[i]), max(longest, lengths[i])
            usable = min(prefix, shortest - 1)
            if usable < min_shared_prefix:
                break
            caps.update((usable, usable + widest - longest))
    best_saving, best_runs = 0, []
    for cap in sorted(caps, reverse=True):
        if sum(min(p, cap) for p in pairs) <= best_saving:
            break
        saving, runs = _runs_within(lengths, neighbour, min_shared_prefix, widest, cap)
        if saving > best_saving:
            best_saving, best_runs = saving, runs
    return [([order[k] for k in range(i, j)], length) for i, j, length in best_runs]


@dataclass(frozen=True)
class PrefixSplit:
    """Where each distinct prompt's tokens go under prefix sharing: its first prefix_len[i] tokens are row
    prefix_row[i] of the prefix forward, the rest its row of the suffix forward."""

    prefix_len: list[int]
    """Per prompt: tokens prefilled in the prefix forward (0: none; then prefix_row is 0 and masked out)."""
    prefix_row: list[int]
    """Per prompt: its row of the prefix forward."""
    prefix_rows: list[tuple[int, int]]
    """Per row of the prefix forward: (a prompt it serves, prefix length)."""
    suffix_width: int
    """Positions of the suffix forward: the longest suffix."""

    @property
    def width(self) -> int:
        """Positions per row of the cache: the longest prefix plus the longest suffix."""
        return max(n for _, n in self.prefix_rows) + self.suffix_width


def split_prompts(prompts: list[list[int]], runs: list[tuple[list[int], int]]) -> PrefixSplit:
    """The split of `prompts` for `runs` (non-empty, from `shared_prefix_runs`).

    A run's rows put their shared prefix in one prefix row. A prompt outside the runs that is longer than the
    longest suffix of a shared row puts its head in a prefix row of its own (unshared: the same tokens are computed
    once either way), so that it never widens the cache: with it, the width is at most max(longest prefix +
    longest shared suffix, longest prompt), which `shared_prefix_runs` keeps within the longest prompt.
    """
    prefix_len, prefix_row, prefix_rows = [0] * len(prompts), [0] * len(prompts), []
    for rows, length in runs:
        for row in rows:
            prefix_len[row], prefix_row[row] = length, len(prefix_rows)
        prefix_rows.append((rows[0], length))
    suffix = max(len(prompts[row]) - length for rows, length in runs for row in rows)
    for i, prompt in enumerate(prompts):
        if prefix_len[i] == 0 and len(prompt) > suffix:
            prefix_len[i], prefix_row[i] = len(prompt) - suffix, len(prefix_rows)
            prefix_rows.append((i, len(prompt) - suffix))
    return PrefixSplit(prefix_len, prefix_row, prefix_rows, suffix)


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
        split = split_prompts(distinct, runs)
        prefix_ids, prefix_mask = left_pad([distinct[i][:n] for i, n in split.prefix_rows], pad_token_id, device)
        suffix_ids, suffix_mask = left_pad([p[n:] for p, n in zip(distinct, split.prefix_len)], pad_token_id, device)
        cache = new_cache(split.width)
        forward_through_cache(model, prefix_ids, prefix_mask, _positions(prefix_mask), cache, chunk)
        expand = torch.tensor(split.prefix_row, dtype=torch.long, device=device)
        cache.reorder_cache(expand)
        has_prefix = torch.tensor([n > 0 for n in split.prefix_len], dtype=torch.long, device=device)[:, None]
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
