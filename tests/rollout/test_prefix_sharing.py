"""Common-prefix sharing: prompts that agree on a long prefix prefill it once, and decode as if each had its own."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import PreTrainedModel

from memagent.rollout import SamplingParams, generate
from memagent.rollout.prefill import shared_prefix_runs

GREEDY = SamplingParams(temperature=0.0)


def common_prefix(rows: list[list[int]]) -> int:
    n = min(map(len, rows))
    return next((i for i in range(n) if any(r[i] != rows[0][i] for r in rows)), n)


def usable_prefix(prompts: list[list[int]], group: list[int]) -> int:
    """The longest prefix a group may share: common to its rows and leaving every row a token of its own."""
    rows = [prompts[i] for i in group]
    return min(common_prefix(rows), min(map(len, rows)) - 1)


def layout_width(prompts: list[list[int]], runs: list[tuple[list[int], int]]) -> int:
    """Positions per row of a shared prefill: the longest prefix row plus the longest suffix. A prompt outside the
    runs that is longer than every shared row's suffix puts its head in a prefix row of its own."""
    if not runs:
        return max(map(len, prompts))
    prefix_of = {row: n for rows, n in runs for row in rows}
    suffix = max(len(prompts[row]) - n for row, n in prefix_of.items())
    alone = [len(p) - suffix for i, p in enumerate(prompts) if i not in prefix_of]
    return max([n for _, n in runs] + alone) + suffix


def saving(runs: list[tuple[list[int], int]]) -> int:
    return sum((len(rows) - 1) * n for rows, n in runs)


def best_saving_over_sorted_runs_that_fit(prompts: list[list[int]], min_shared: int) -> int:
    """Every way of cutting the sorted prompts into runs, with every prefix length each run may share; the best
    saving among those whose layout is no wider than the longest prompt."""
    order = sorted(range(len(prompts)), key=lambda i: prompts[i])
    widest = max(map(len, prompts))
    best = 0
    for cuts in range(2 ** max(len(order) - 1, 0)):
        groups, group = [], [order[0]]
        for k in range(1, len(order)):
            if cuts >> (k - 1) & 1:
                groups.append(group)
                group = []
            group.append(order[k])
        groups = [g for g in groups + [group] if len(g) >= 2]
        lengths = [range(min_shared, usable_prefix(prompts, g) + 1) for g in groups]
        for prefixes in itertools.product(*lengths):
            runs = list(zip(groups, prefixes))
            if layout_width(prompts, runs) <= widest:
                best = max(best, saving(runs))
    return best


distinct_prompt_sets = st.one_of(
    st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=7), min_size=1, max_size=6, unique_by=tuple),
    # two symbols and longer prompts: long shared prefixes, so the width bound often decides the plan
    st.lists(st.lists(st.integers(0, 1), min_size=1, max_size=10), min_size=1, max_size=5, unique_by=tuple),
)


@st.composite
def memagent_round(draw) -> tuple[list[list[int]], int]:
    """Prompts shaped like a later MemAgent round: template + problem_q + memory_qg + chunk_q + the generation
    prompt, for Q questions x G trajectories (problems and memories told apart by their first token). Returns the
    prompts and G."""
    questions, group = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    tokens = st.lists(st.integers(10, 12), min_size=0, max_size=6)
    template = draw(tokens)
    prompts = []
    for q in range(questions):
        problem, chunk = [20 + q, *draw(tokens)], draw(tokens)
        prompts += [template + problem + [30 + g, *draw(tokens)] + chunk + [9] for g in range(group)]
    return prompts, group


@settings(max_examples=300, deadline=None)
@given(round_and_group=memagent_round(), min_shared=st.integers(1, 4))
def test_prefix_runs_save_at_least_what_grouping_by_question_or_sharing_the_template_saves(round_and_group, min_shared):
    """Either grouping counts when it shares at least min_shared tokens and fits the longest prompt."""
    prompts, group = round_and_group
    found = saving(shared_prefix_runs(prompts, min_shared))
    by_question = [(list(range(q, q + group)), usable_prefix(prompts, list(range(q, q + group))))
                   for q in range(0, len(prompts), group)]
    everything = list(range(len(prompts)))
    for runs in (by_question, [(everything, usable_prefix(prompts, everything))]):
        runs = [(rows, n) for rows, n in runs if len(rows) >= 2 and n >= min_shared]
        if layout_width(prompts, runs) <= max(map(len, prompts)):
            assert found >= saving(runs)


@settings(max_examples=300, deadline=None)
@given(prompts=distinct_prompt_sets, min_shared=st.integers(1, 4))
def test_prefix_runs_are_the_best_sorted_runs_that_fit_the_longest_prompt(prompts, min_shared):
    runs = shared_prefix_runs(prompts, min_shared)
    for rows, n in runs:
        assert len(rows) >= 2 and min_shared <= n <= usable_prefix(prompts, rows)
    assert layout_width(prompts, runs) <= max(map(len, prompts))
    assert saving(runs) == best_saving_over_sorted_runs_that_fit(prompts, min_shared)


def test_prefix_runs_trim_a_long_prefix_when_that_lets_another_run_fit():
    """Sharing all 10 tokens of the first pair leaves 1 position of suffix, too few for the second pair's 3; sharing
    8 leaves 3, so both pairs share (8 + 5 = 13 tokens saved, against 10 for the first pair alone)."""
    prompts = [[0] * 10 + [1], [0] * 10 + [2], [1] * 5 + [0, 0, 0], [1] * 5 + [2, 2, 2]]
    runs = shared_prefix_runs(prompts, min_shared_prefix=2)
    assert sorted(runs) == [([0, 1], 8), ([2, 3], 5)]
    assert layout_width(prompts, runs) == 11


@pytest.fixture
def grouped_prompts(model: PreTrainedModel) -> list[list[int]]:
    """Shaped like a later MemAgent round: 3 questions x G 3, a group agrees up to its 'memory'; a row repeats,
    and one prompt shares nothing with the others."""
    g = torch.Generator().manual_seed(2)

    def tokens(n: int) -> list[int]:
        return torch.randint(3, model.config.vocab_size, (n,), generator=g).tolist()

    template = tokens(6)
    prompts = []
    for _ in range(3):
        problem, chunk = tokens(9), tokens(5)
        prompts += [template + problem + tokens(k) + chunk for k in (1, 4, 2)]
    prompts.append(list(prompts[4]))
    prompts.append(tokens(7))
    return prompts


@pytest.mark.parametrize("chunk", [0, 4])
def test_greedy_decoding_with_shared_prefixes_equals_unshared_prefill(model, grouped_prompts, chunk):
    limits = [5, 9, 3, 12, 6, 8, 7, 10, 4, 11, 6]
    kwargs = dict(max_new_tokens=limits, eos_token_id=None, params=GREEDY, prefill_chunk_tokens=chunk)
    unshared = generate(model, grouped_prompts, share_prefill=False, **kwargs)
    shared = generate(model, grouped_prompts, share_prefill=True, min_shared_prefix=8, **kwargs)
    assert shared.tokens == unshared.tokens
    for a, b in zip(shared.logprobs, unshared.logprobs):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-4)


def test_shared_prefixes_are_prefilled_once_per_group(model, grouped_prompts):
    shapes: list[tuple[int, int]] = []
    handle = model.register_forward_pre_hook(
        lambda _m, _a, kw: shapes.append(tuple(kw["input_ids"].shape)), with_kwargs=True
    )
    try:
        generate(model, grouped_prompts, max_new_tokens=2, eos_token_id=None, params=GREEDY, min_shared_prefix=8)
    finally:
        handle.remove()
    prefix, suffix = shapes[0], shapes[1]
    assert prefix[0] == 3  # one row per question group: template + problem (15 tokens) shared by its 3 prompts
    assert prefix[1] == 15
    assert suffix[0] == 10  # one row per distinct prompt: the repeated one is copied afterwards
    assert suffix[1] == 9  # the longest suffix: a memory of 4 tokens and a chunk of 5


def test_no_prefix_is_shared_below_the_minimum(model, grouped_prompts):
    runs = shared_prefix_runs(grouped_prompts[:-2], min_shared_prefix=16)
    assert runs == []
