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


def group_saving(prompts: list[list[int]], group: list[int], min_shared: int) -> int:
    """(size - 1) * usable prefix of one group; usable: common, >= min_shared, and leaving every row a token."""
    rows = [prompts[i] for i in group]
    usable = min(common_prefix(rows), min(map(len, rows)) - 1)
    return (len(group) - 1) * usable if len(group) >= 2 and usable >= min_shared else 0


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
    prompts, group = round_and_group
    saving = sum((len(rows) - 1) * n for rows, n in shared_prefix_runs(prompts, min_shared))
    by_question = sum(group_saving(prompts, list(range(q, q + group)), min_shared)
                      for q in range(0, len(prompts), group))
    assert saving >= by_question
    assert saving >= group_saving(prompts, list(range(len(prompts))), min_shared)


@settings(max_examples=300, deadline=None)
@given(prompts=distinct_prompt_sets, min_shared=st.integers(1, 4))
def test_prefix_runs_are_the_best_runs_of_the_sorted_prompts_for_any_prompts(prompts, min_shared):
    runs = shared_prefix_runs(prompts, min_shared)
    assert sum((len(rows) - 1) * n for rows, n in runs) == best_saving_over_sorted_runs(prompts, min_shared)


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
