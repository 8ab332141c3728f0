"""Common-prefix sharing: prompts that agree on a long prefix prefill it once, and decode as if each had its own."""

from __future__ import annotations

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


def set_partitions(items: list[int]):
    """Every partition of `items` into non-empty groups (the slow obvious reference's search space)."""
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for partition in set_partitions(rest):
        yield [[first], *partition]
        for k in range(len(partition)):
            yield [*partition[:k], [first, *partition[k]], *partition[k + 1 :]]


def group_saving(prompts: list[list[int]], group: list[int], min_shared: int) -> int:
    """(size - 1) * usable prefix of one group; usable: common, >= min_shared, and leaving every row a token."""
    rows = [prompts[i] for i in group]
    usable = min(common_prefix(rows), min(map(len, rows)) - 1)
    return (len(group) - 1) * usable if len(group) >= 2 and usable >= min_shared else 0


def best_saving_over_all_groupings(prompts: list[list[int]], min_shared: int) -> int:
    return max(sum(group_saving(prompts, g, min_shared) for g in partition)
               for partition in set_partitions(list(range(len(prompts)))))


def best_saving_over_sorted_runs(prompts: list[list[int]], min_shared: int) -> int:
    """The best grouping into runs that are contiguous in sorted order: every way of cutting the sorted list."""
    order = sorted(range(len(prompts)), key=lambda i: prompts[i])
    best = 0
    for cuts in range(2 ** max(len(order) - 1, 0)):
        runs, run = [], [order[0]]
        for k in range(1, len(order)):
            if cuts >> (k - 1) & 1:
                runs.append(run)
                run = []
            run.append(order[k])
        runs.append(run)
        best = max(best, sum(group_saving(prompts, r, min_shared) for r in runs))
    return best


distinct_prompt_sets = st.lists(
    st.lists(st.integers(0, 2), min_size=1, max_size=7), min_size=1, max_size=6, unique_by=tuple
)


@st.composite
def memagent_round(draw) -> list[list[int]]:
    """Prompts shaped like a later MemAgent round: template + problem_q + memory_qg + chunk_q for Q questions x G
    trajectories, problems and memories told apart by their first token (random lengths, Q * G <= 6)."""
    questions, group = draw(st.integers(1, 3)), draw(st.integers(1, 2))
    tokens = st.lists(st.integers(10, 12), min_size=0, max_size=3)
    template = draw(tokens)
    prompts = []
    for q in range(questions):
        problem, chunk = [20 + q, *draw(tokens)], draw(tokens)
        prompts += [template + problem + [30 + g, *draw(tokens)] + chunk + [END] for g in range(group)]
    return prompts


END = 9
"""The generation prompt's last token: chat prompts all end with it."""


@settings(max_examples=300, deadline=None)
@given(prompts=memagent_round(), min_shared=st.integers(1, 4))
def test_prefix_runs_save_as_much_as_any_grouping_on_memagent_shaped_prompts(prompts, min_shared):
    runs = shared_prefix_runs(prompts, min_shared)
    assert sum((len(rows) - 1) * n for rows, n in runs) == best_saving_over_all_groupings(prompts, min_shared)


@settings(max_examples=300, deadline=None)
@given(prompts=distinct_prompt_sets, min_shared=st.integers(1, 4))
def test_prefix_runs_are_the_best_runs_of_the_sorted_prompts_for_any_prompts(prompts, min_shared):
    runs = shared_prefix_runs(prompts, min_shared)
    assert sum((len(rows) - 1) * n for rows, n in runs) == best_saving_over_sorted_runs(prompts, min_shared)


@pytest.fixture
def model(tiny_model: PreTrainedModel) -> PreTrainedModel:
    """The tiny model with its matrices scaled 6x, for varied greedy continuations (see test_generate.py)."""
    with torch.no_grad():
        for p in tiny_model.parameters():
            if p.dim() == 2:
                p.mul_(6.0)
    return tiny_model


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
