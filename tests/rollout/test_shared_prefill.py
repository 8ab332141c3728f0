"""Shared prefill: identical prompts are prefilled once, and decoding is the same as if each had its own prefill."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from memagent.rollout import ChatRequest, SamplingParams, generate
from memagent.rollout.llm import LocalLLM

GREEDY = SamplingParams(temperature=0.0)
LAYOUT = (0, 1, 0, 2, 1, 0, 3)
"""Row i repeats distinct prompt LAYOUT[i]: three copies of prompt 0, two of prompt 1, prompts 2 and 3 alone."""
DISTINCT_LENGTHS = (5, 11, 3, 8)
LIMITS = [6, 9, 3, 12, 9, 10, 7]
"""Per-row max_new_tokens: copies of one prompt get different limits, so they leave the batch at different steps."""


@pytest.fixture
def prompts(model: PreTrainedModel) -> list[list[int]]:
    """Seven prompts, four distinct, duplicates interleaved with the others."""
    g = torch.Generator().manual_seed(0)
    distinct = [torch.randint(3, model.config.vocab_size, (n,), generator=g).tolist() for n in DISTINCT_LENGTHS]
    return [list(distinct[k]) for k in LAYOUT]  # equal by value, not the same list objects


def eos_ids(model: PreTrainedModel, prompts: list[list[int]]) -> list[int]:
    """Two tokens that unshared greedy decoding produces mid-sequence, so several rows stop on EOS."""
    out = generate(model, prompts, max_new_tokens=12, eos_token_id=None, params=GREEDY, share_prefill=False)
    return [out.tokens[0][2], out.tokens[3][4]]


def record_forward_batches(model: PreTrainedModel) -> tuple[list[tuple[int, int]], torch.utils.hooks.RemovableHandle]:
    """Hook the model so that every forward appends its input_ids shape (rows, positions) to the returned list."""
    shapes: list[tuple[int, int]] = []

    def hook(_module, _args, kwargs):
        shapes.append(tuple(kwargs["input_ids"].shape))

    return shapes, model.register_forward_pre_hook(hook, with_kwargs=True)


@pytest.mark.parametrize("chunk", [0, 4])
def test_greedy_tokens_and_logprobs_equal_unshared_prefill(model, prompts, chunk):
    eos = eos_ids(model, prompts)
    kwargs = dict(max_new_tokens=LIMITS, eos_token_id=eos, params=GREEDY, prefill_chunk_tokens=chunk)
    unshared = generate(model, prompts, share_prefill=False, **kwargs)
    shared = generate(model, prompts, share_prefill=True, **kwargs)
    assert any(unshared.finished) and not all(unshared.finished)  # EOS and the limits both end some rows
    assert shared.tokens == unshared.tokens
    assert shared.finished == unshared.finished
    for a, b in zip(shared.logprobs, unshared.logprobs):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_rows_with_zero_new_tokens_beside_shared_copies_stay_empty(model, prompts):
    limits = [0, 5, 4, 0, 5, 0, 3]  # two copies of prompt 0 ask for nothing, one for 4 tokens
    unshared = generate(model, prompts, max_new_tokens=limits, eos_token_id=None, params=GREEDY, share_prefill=False)
    shared = generate(model, prompts, max_new_tokens=limits, eos_token_id=None, params=GREEDY)
    assert shared.tokens == unshared.tokens
    assert [len(t) for t in shared.tokens] == limits


def test_seeded_sampling_from_shared_prefill_gives_valid_independent_rows(model, prompts):
    params = SamplingParams(temperature=1.0, top_p=0.9)
    eos = eos_ids(model, prompts)
    out = generate(model, prompts, max_new_tokens=LIMITS, eos_token_id=eos, params=params,
                   generator=torch.Generator().manual_seed(3))
    for tokens, logprobs, finished, limit in zip(out.tokens, out.logprobs, out.finished, LIMITS):
        assert 1 <= len(tokens) <= limit and len(logprobs) == len(tokens)
        assert all(0 <= t < model.config.vocab_size for t in tokens)
        assert torch.isfinite(logprobs).all() and (logprobs <= 0).all()
        assert finished == (tokens[-1] in eos)
        assert not any(t in eos for t in tokens[:-1])  # a row stops at its first EOS
    copies = [out.tokens[i] for i, k in enumerate(LAYOUT) if k == 0]
    assert len({tuple(t) for t in copies}) > 1  # copies of one prompt draw their own tokens


def test_seeded_sampling_draws_the_same_tokens_with_sharing_on_and_off(model, prompts):
    params = SamplingParams(temperature=1.0)
    runs = [generate(model, prompts, max_new_tokens=LIMITS, eos_token_id=None, params=params,
                     generator=torch.Generator().manual_seed(5), share_prefill=share, prefill_chunk_tokens=3)
            for share in (False, True)]
    assert runs[0].tokens == runs[1].tokens
    for a, b in zip(runs[0].logprobs, runs[1].logprobs):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("share, chunk", [(True, 0), (True, 4), (False, 0)])
def test_prefill_forwards_see_one_row_per_distinct_prompt(model, prompts, share, chunk):
    """Fails when sharing is off: the prefill then runs all 7 rows. Decoding always runs one row per prompt."""
    shapes, handle = record_forward_batches(model)
    try:
        generate(model, prompts, max_new_tokens=4, eos_token_id=None, params=GREEDY, share_prefill=share,
                 prefill_chunk_tokens=chunk)
    finally:
        handle.remove()
    width = max(DISTINCT_LENGTHS)
    prefill_calls = math.ceil(width / chunk) if chunk else 1
    prefill_rows = {rows for rows, _ in shapes[:prefill_calls]}
    expected = len(set(LAYOUT)) if share else len(LAYOUT)
    assert prefill_rows == {expected}
    assert sum(positions for _, positions in shapes[:prefill_calls]) == width
    assert shapes[prefill_calls:] == [(len(LAYOUT), 1)] * 3  # 3 decode steps after the first sampled token


def test_all_distinct_prompts_prefill_every_row(model, prompts):
    distinct = prompts[:2] + prompts[3:4] + prompts[6:]  # one copy of each
    shapes, handle = record_forward_batches(model)
    try:
        generate(model, distinct, max_new_tokens=1, eos_token_id=None, params=GREEDY)
    finally:
        handle.remove()
    assert shapes == [(len(distinct), max(DISTINCT_LENGTHS))]


@pytest.mark.parametrize("share", [True, False])
def test_local_llm_prefills_a_group_of_identical_chats_once_when_sharing(
    tiny_model: PreTrainedModel, tiny_tokenizer: PreTrainedTokenizerBase, share: bool
):
    group = 4
    llm = LocalLLM(tiny_model, tiny_tokenizer, params=SamplingParams(), generator=torch.Generator().manual_seed(0),
                   share_prefill=share)
    requests = [ChatRequest(messages=({"role": "user", "content": "the same question"},), max_new_tokens=3)
                for _ in range(group)]
    shapes, handle = record_forward_batches(tiny_model)
    try:
        completions = llm.complete(requests)
    finally:
        handle.remove()
    assert shapes[0][0] == (1 if share else group)
    assert len(completions) == group and all(c.prompt_ids == completions[0].prompt_ids for c in completions)
