"""Which rows share a micro-batch: index groups over row lengths, pure functions of ints (no model, no tensors in).

The update and the log-prob passes cut one mini-batch's rows (one per conversation: K memory updates and the
answer of each trajectory) into micro-batches of at most `budget` padded tokens (rows x longest row) and right-pad
each one. Memory-update rows are long (chunk + memory + template) and answer rows short, so cutting the rows in
trajectory order pads every answer row to a memory row's length.

Why any grouping is exact: the loss of one optimizer update is sum_{rows, t} m_t * l_t / N with N counted over the
whole mini-batch (all ranks) BEFORE the micro-batch loop (docs/rl-math.md §3). Each micro-batch backpropagates its
own part of that sum, so which rows share a micro-batch, and in which order, changes the float summation order and
nothing else (tests/rl/test_packing.py checks loss and gradient in float64 for several budgets).

Functions:
    pack_by_token_budget   rows in the given order, greedily (the original packing; still exported by step.py).
    pack_by_length         rows sorted by length (descending, stable), then cut into runs minimizing padded tokens
                           + a per-micro-batch cost (exact DP); never more padding than the in-order packing.
    padded_fraction        padding positions / all positions of a packing.
    pack_by_shared_prefix  rows whose prompts share a long prefix together, the prefix run once per micro-batch
                           (memagent.model.shared_prefix); the rest by pack_by_length.
    pack_concatenated      remove-padding: rows concatenated into ONE sequence per group (first-fit decreasing,
                           sum of lengths <= budget), with packed_position_ids restarting at 0 per row. With
                           attention_mask None, transformers 5.25 (masking_utils.find_packed_sequence_indices, used
                           by Llama/Qwen2 under sdpa and eager when there is no cache) builds the block-causal mask
                           from such position ids. Not wired into the trainer (see the figures below).

Measured (bench/packing.py, BENCHMARKS.md "Packing": real run_memagent rows, 2 mini-batches; CPU, 1 thread):

    padded fraction                              micro_batch_tokens   in order   pack_by_length
      tiny demo mix (chunk 32, memory 10)               8192            17.9%         1.4%
      SmolLM2-135M mix (chunk 512, memory 128)          2048            21.5%         0.6%
                                                        8192            26.2%         3.2%
                                                       16384            26.3%         3.9%

    update tokens/s, random Llama of SmolLM2-135M's shape, float32, 12 rows (8264 tokens), budget 2048
      in order (padded) 63      pack_by_length 96 (1.53x)      remove-padding (pack_concatenated) 63

On CPU/SDPA the remove-padding row builds a dense [T, T] block-causal mask and pays attention over the whole
concatenated row (no varlen kernel), while pack_by_length pays attention only within rows of similar length;
with padding already under 5%, pack_by_length is the one wired in (memagent.rl.step.micro_batches).
"""

from __future__ import annotations

import torch

from memagent.rollout.prefill import shared_prefix_runs


def pack_by_token_budget(lengths: list[int], budget: int) -> list[list[int]]:
    """Group row indices, in order, so each group's padded size (rows x longest row) fits `budget` tokens.

    lengths: [R] ints, tokens per row. budget: padded tokens per group. Returns groups of indices into `lengths`,
    every index once, in order. A row longer than the budget gets a group of its own. Sorting is left to the
    caller: keeping the order keeps the packing (and the float summation order) a pure function of the rows.
    """
    groups: list[list[int]] = []
    longest = 0
    for i, n in enumerate(lengths):
        if groups and (len(groups[-1]) + 1) * max(longest, n) <= budget:
            groups[-1].append(i)
            longest = max(longest, n)
        else:
            groups.append([i])
            longest = n
    return groups


def pack_by_shared_prefix(
    prompts: list[list[int]], lengths: list[int], budget: int, min_prefix: int
) -> list[tuple[list[int], int]]:
    """Micro-batches of rows that run a shared prompt prefix once (memagent.model.shared_prefix), and of the rest.

    prompts: [R] prompt token lists (never trained on); lengths: [R] ints, prompt + response tokens per row;
    budget: padded tokens per micro-batch, counted as prefix + rows x longest suffix; min_prefix: shortest prefix
    worth a forward of its own. Returns (row indices, prefix length) per micro-batch, every index exactly once;
    prefix 0 = a plain micro-batch. The runs are the generation engine's (memagent.rollout.prefill: sorted prompts,
    a DP maximising the prefix tokens saved, each prefix at least one token short of every prompt of its run, so no
    trained token and no first suffix position is in it). That plan also keeps prefix + longest suffix within the
    longest prompt, a bound the engine's KV cache needs and training does not; it costs 0-4% of the saving there
    and one planner serves both. Each run is cut by pack_by_length over its suffixes, and a micro-batch of one row
    gains nothing from a prefix, so it joins the plain rows.
    """
    shared: list[tuple[list[int], int]] = []
    plain = set(range(len(lengths)))
    for rows, prefix in shared_prefix_runs(prompts, min_prefix) if min_prefix > 0 else []:
        suffixes = [lengths[i] - prefix for i in rows]
        for group in pack_by_length(suffixes, max(budget - prefix, 1)):
            if len(group) > 1:
                shared.append(([rows[g] for g in group], prefix))
                plain.difference_update(rows[g] for g in group)
    rest = sorted(plain)
    return shared + [([rest[g] for g in group], 0) for group in pack_by_length([lengths[i] for i in rest], budget)]


def length_order(lengths: list[int]) -> list[int]:
    """Row indices by length, longest first; ties keep their input order (stable). lengths: [R] ints -> [R] ints."""
    return sorted(range(len(lengths)), key=lambda i: -lengths[i])


def pack_by_length(lengths: list[int], budget: int, group_cost: int | None = None) -> list[list[int]]:
    """Group row indices so rows of similar length share a micro-batch, with the least padded compute.

    lengths: [R] ints, tokens per row. budget: padded tokens (rows x longest row) per group. group_cost: what one
    more micro-batch is worth, in padded tokens (default budget // 32: a micro-batch is opened when it removes more
    than 1/32 of a budget of padding). Returns groups of indices into `lengths`, every index exactly once; inside a
    group and across groups the indices follow length_order (longest first, stable), so the first group holds
    the longest rows (an out-of-memory shows at once). Each group fits the budget unless it is one row longer
    than it.

    The sorted rows are split into contiguous runs minimizing padded size + group_cost x groups (exact dynamic
    programming; a run s..e-1 of the sorted rows is padded to (e - s) * sorted[s]). Contract: never more padding
    than pack_by_token_budget(lengths, budget), the in-order packing: if the split above pads more, the in-order
    group sizes laid over the sorted rows (sorted_like, which pads no more than in order) are returned instead.
    O(R x rows per group) integer steps (about 10 ms for 1152 MemAgent-7B-shaped rows).
    """
    R = len(lengths)
    if R == 0:
        return []
    cost = max(1, budget // 32) if group_cost is None else group_cost
    order = length_order(lengths)
    runs = _cheapest_runs(order, lengths, budget, cost)
    same = sorted_like(lengths, pack_by_token_budget(lengths, budget))
    return runs if padded_size(lengths, runs) <= padded_size(lengths, same) else same


def _cheapest_runs(order: list[int], lengths: list[int], budget: int, group_cost: int) -> list[list[int]]:
    """Split `order` (indices, longest row first) into contiguous runs that fit the budget, minimizing padded size
    + group_cost x runs (ties: fewer runs). order, lengths: [R] ints. Returns the runs (lists of indices)."""
    R = len(order)
    sl = [lengths[i] for i in order]  # sorted lengths, longest first
    best: list[tuple[int, int]] = [(0, 0)] + [(1 << 62, 0)] * R  # best[e]: (cost, runs) of sorted rows [0, e)
    start = [0] * (R + 1)  # start[e]: where the last run of best[e] begins
    for e in range(1, R + 1):
        for s in range(e - 1, -1, -1):
            size = e - s
            if size > 1 and size * sl[s] > budget:
                break  # moving s left only makes the run longer and its longest row longer
            cand = (best[s][0] + size * sl[s] + group_cost, best[s][1] + 1)
            if cand < best[e]:
                best[e], start[e] = cand, s
    runs: list[list[int]] = []
    e = R
    while e > 0:
        runs.append(order[start[e] : e])
        e = start[e]
    return runs[::-1]


def sorted_like(lengths: list[int], groups: list[list[int]]) -> list[list[int]]:
    """The same group sizes, laid over the rows in length_order: no group's longest row gets longer.

    lengths: [R] ints; groups: a packing of all R indices (e.g. pack_by_token_budget's). The groups are taken by
    their longest row, descending (stable), and the k-th gets the next len(group) rows of length_order. Why no
    longest row grows: the rows longer than a group's longest row m_k all sat in the groups before it, so at most
    the sizes of those groups precede it in length order and its first row is <= m_k. Sizes are unchanged, so
    every group keeps its budget, and the padded size can only shrink. Returns the new groups.
    """
    by_max = sorted(range(len(groups)), key=lambda g: -max((lengths[i] for i in groups[g]), default=0))
    order = length_order(lengths)
    out, at = [], 0
    for g in by_max:
        out.append(order[at : at + len(groups[g])])
        at += len(groups[g])
    return out


def padded_size(lengths: list[int], groups: list[list[int]]) -> int:
    """Positions of a packing when each group is right-padded to its longest row. lengths: [R]; groups of indices."""
    return sum(len(g) * max((lengths[i] for i in g), default=0) for g in groups)


def padded_fraction(lengths: list[int], groups: list[list[int]]) -> float:
    """Padding positions / all positions when each group is right-padded to its longest row.

    lengths: [R] ints; groups: lists of indices into `lengths` (empty groups allowed: the trainer's dummy
    micro-batches, counted as 0 positions here). Returns a float in [0, 1); 0.0 for no positions at all.
    """
    total = padded_size(lengths, groups)
    real = sum(lengths[i] for g in groups for i in g)
    return 0.0 if total == 0 else (total - real) / total


def pack_concatenated(lengths: list[int], budget: int) -> list[list[int]]:
    """Remove-padding groups: rows whose lengths sum to at most `budget`, to be concatenated into one sequence each.

    lengths: [R] ints; budget: tokens per concatenated sequence. First-fit decreasing over length_order: each row
    goes into the first group it fits in, else opens a new one (a row longer than the budget is alone). Returns
    groups of indices, every index once, each group in length_order.
    """
    groups: list[list[int]] = []
    room: list[int] = []
    for i in length_order(lengths):
        n = lengths[i]
        for g, left in enumerate(room):
            if n <= left:
                groups[g].append(i)
                room[g] -= n
                break
        else:
            groups.append([i])
            room.append(budget - n)
    return groups


def packed_position_ids(lengths: list[int], group: list[int]) -> torch.Tensor:
    """[1, sum of the group's lengths] long position ids of a concatenated group: 0..n-1 for each row in turn.

    With attention_mask None and no cache, transformers 5.25's create_causal_mask turns a reset to 0 into a
    new block of a block-causal mask, so no token attends across rows.
    """
    parts = [torch.arange(lengths[i], dtype=torch.long) for i in group]
    return (torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long)).unsqueeze(0)
