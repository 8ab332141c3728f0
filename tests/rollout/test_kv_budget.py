"""The KV cache stays within what a budget assumes, the longest prompt plus max_new_tokens per row, also when prompts
share prefixes (issue 23: middle padding widened rows to the longest prefix plus the longest suffix)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from memagent.model.shape import (
    ModelShape,
    kv_bytes_per_token,
    row_bytes,
    shape_from_config,
    tokens_per_row_within,
)
from memagent.records import ChatRequest
from memagent.rollout import SamplingParams, generate
from memagent.rollout.llm import LocalLLM
from memagent.rollout.prefill import prefill_prompts

GREEDY = SamplingParams(temperature=0.0)


def bytes_per_token(model: PreTrainedModel) -> int:
    return kv_bytes_per_token(shape_from_config(model.config.to_dict()), dtype_bytes=4)


@pytest.fixture
def system_prompt_beside_a_stranger(model: PreTrainedModel) -> list[list[int]]:
    """The issue's case at a tenth of its size: 4 prompts of a 60-token system prompt and 9 tokens of their own, and
    an unrelated prompt of 64 tokens. Shared naively: 60 + 64 = 124 positions per row for prompts of at most 69."""
    g = torch.Generator().manual_seed(3)

    def tokens(n: int) -> list[int]:
        return torch.randint(3, model.config.vocab_size, (n,), generator=g).tolist()

    system = tokens(60)
    return [system + tokens(9) for _ in range(4)] + [tokens(64)]


def test_a_shared_system_prompt_beside_an_unrelated_prompt_stays_within_the_budgeted_width(
    model, system_prompt_beside_a_stranger, cache_meter
):
    prompts, new_tokens = system_prompt_beside_a_stranger, 8
    shapes: list[tuple[int, int]] = []
    handle = model.register_forward_pre_hook(
        lambda _m, _a, kw: shapes.append(tuple(kw["input_ids"].shape)), with_kwargs=True
    )
    try:
        shared = generate(model, prompts, max_new_tokens=new_tokens, eos_token_id=None, params=GREEDY)
    finally:
        handle.remove()
    budget = len(prompts) * (max(map(len, prompts)) + new_tokens) * bytes_per_token(model)
    assert 0 < cache_meter.peak <= budget  # was 5 x (124 + 8) positions against 5 x (69 + 8)
    # The system prompt is still prefilled once: one prefix row for the 4 prompts, one for the stranger's head.
    assert shapes[0] == (2, 60)
    assert shapes[1] == (5, 9)
    unshared = generate(model, prompts, max_new_tokens=new_tokens, eos_token_id=None, params=GREEDY,
                        share_prefill=False)
    assert shared.tokens == unshared.tokens


prompt_sets = st.lists(st.lists(st.integers(3, 5), min_size=1, max_size=10), min_size=1, max_size=6)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompts=prompt_sets, min_shared=st.integers(1, 3))
def test_a_shared_prefill_is_never_wider_than_the_longest_prompt_and_gives_the_plain_logits(
    model, prompts, min_shared
):
    """Any prompts (repeats included): the shared prefill's cache is at most the longest prompt wide."""

    def prefill(share: bool):
        with torch.no_grad():
            return prefill_prompts(model, prompts, pad_token_id=0, chunk=0, share_prefill=share,
                                   new_cache=lambda _width: DynamicCache(config=model.config),
                                   min_shared_prefix=min_shared)

    shared, plain = prefill(True), prefill(False)
    assert shared.mask.shape[1] <= max(map(len, prompts))
    assert shared.cache.get_seq_length() == shared.mask.shape[1]
    assert shared.mask.sum(1).tolist() == [len(p) for p in prompts]
    torch.testing.assert_close(shared.logits, plain.logits, rtol=0, atol=1e-4)
    assert torch.equal(shared.last_positions, plain.last_positions)


@pytest.mark.parametrize("chunk", [0, 1, 7, 64])
@pytest.mark.parametrize("budget", [0.5, 3_000.0, 40_000.0, 1e6])
def test_tokens_per_row_within_is_the_longest_row_the_budget_holds(chunk, budget):
    shape = ModelShape(hidden=64, layers=2, heads=4, kv_heads=2, intermediate=256, vocab=512, tied=True)
    longest = next(t for t in range(10**6) if row_bytes(shape, t + 1, chunk, 4) > budget)  # the slow reference
    assert tokens_per_row_within(shape, budget, chunk, dtype_bytes=4) == longest


def mixed_chats(max_new_tokens: list[int]) -> list[ChatRequest]:
    """Four chats under one system prompt of ~100 tokens (114 tokens each), then chats of a ~150-token request
    sharing nothing with them (156 tokens): the shape of evaluate.py or serve traffic, not of a MemAgent round."""
    system = "You are a careful reader. Read the document section by section and keep notes of every code you see. "
    other = "Summarise the following: the quick brown fox jumps over the lazy dog near the river bank at dawn. "
    shared = [({"role": "system", "content": system * 2}, {"role": "user", "content": f"What is the code of key {i}?"})
              for i in range(4)]
    messages = shared + [({"role": "user", "content": other * 2},)] * (len(max_new_tokens) - 4)
    return [ChatRequest(messages=m, max_new_tokens=n) for m, n in zip(messages, max_new_tokens)]


def test_local_llm_keeps_the_cache_of_mixed_chats_within_its_kv_budget(model, tiny_tokenizer, cache_meter):
    requests = mixed_chats([16] * 5 + [200])
    prompts = [LocalLLM(model, tiny_tokenizer).render(r) for r in requests]
    shape, longest = shape_from_config(model.config.to_dict()), max(map(len, prompts))
    budget = 5 * row_bytes(shape, longest + 16, 0, dtype_bytes=4)
    llm = LocalLLM(model, tiny_tokenizer, params=GREEDY, kv_cache_budget_bytes=budget)
    # The 200-token request does not fit beside the five others, and only its own call is sized for it.
    assert llm.call_slices(prompts, [r.max_new_tokens for r in requests]) == [(0, 5), (5, 6)]
    llm.complete(requests)
    assert 0 < cache_meter.peak <= budget  # was 5 x (about 100 + 156 + 16) positions: a 4-row budget overrun


@st.composite
def prompts_and_limits(draw) -> tuple[list[list[int]], list[int]]:
    lengths = draw(st.lists(st.integers(1, 60), min_size=1, max_size=12))
    limits = draw(st.lists(st.integers(1, 120), min_size=len(lengths), max_size=len(lengths)))
    return [[3] * n for n in lengths], limits


def slices_by_rescanning(llm: LocalLLM, prompts: list[list[int]], limits: list[int]) -> list[tuple[int, int]]:
    """The slow reference: grow the open call while `rows_per_call` of everything in it holds it."""
    slices, start = [], 0
    for end in range(1, len(prompts) + 1):
        if end - start > llm.rows_per_call(prompts[start:end], limits[start:end]):
            slices.append((start, end - 1))
            start = end - 1
    return slices + [(start, len(prompts))]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=prompts_and_limits(), rows_of_100=st.floats(0.5, 8), cap=st.sampled_from([None, 2, 5]))
def test_call_slices_fill_each_call_to_the_budget_at_its_own_longest_row(
    tiny_model: PreTrainedModel, tiny_tokenizer: PreTrainedTokenizerBase, case, rows_of_100, cap
):
    prompts, limits = case
    budget = rows_of_100 * row_bytes(shape_from_config(tiny_model.config.to_dict()), 100, 0, dtype_bytes=4)
    llm = LocalLLM(tiny_model, tiny_tokenizer, kv_cache_budget_bytes=budget, max_batch_rows=cap)
    slices = llm.call_slices(prompts, limits)
    assert slices == slices_by_rescanning(llm, prompts, limits)
    assert [i for s, e in slices for i in range(s, e)] == list(range(len(prompts)))
    for start, end in slices:
        assert end - start <= llm.rows_per_call(prompts[start:end], limits[start:end])
