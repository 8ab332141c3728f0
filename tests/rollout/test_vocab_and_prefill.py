"""Generation never samples an embedding-padding id, and chunked prefill decodes exactly like one-shot prefill."""

from __future__ import annotations

import pytest
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from memagent.model.shape import kv_bytes_per_token, prefill_activation_bytes, shape_from_config
from memagent.records import ChatRequest
from memagent.rollout import SamplingParams, generate
from memagent.rollout.llm import LocalLLM

GREEDY = SamplingParams(temperature=0.0)
PADDED_ROWS = 128


@pytest.fixture
def padded_model(tiny_model: PreTrainedModel, tiny_tokenizer: PreTrainedTokenizerBase) -> PreTrainedModel:
    """The tiny model with its embedding padded past the tokenizer (like Qwen2.5's 152064 rows for 151665 tokens),
    the padded head rows +-50 e_d, so that whatever the hidden state, some padded id has the largest logit."""
    hidden = tiny_model.config.hidden_size
    assert 2 * hidden <= PADDED_ROWS
    tiny_model.resize_token_embeddings(len(tiny_tokenizer) + PADDED_ROWS, mean_resizing=False)
    head = tiny_model.get_output_embeddings().weight
    with torch.no_grad():
        eye = torch.eye(hidden, dtype=head.dtype)
        head[len(tiny_tokenizer):len(tiny_tokenizer) + 2 * hidden] = 50.0 * torch.cat([eye, -eye])
    return tiny_model


def _prompts(vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in (5, 17, 9)]


def test_unmasked_generation_samples_padding_ids_of_a_padded_embedding(padded_model, tiny_tokenizer):
    """The failure the vocab mask prevents: the biased padded rows win without it."""
    out = generate(padded_model, _prompts(len(tiny_tokenizer)), max_new_tokens=4, eos_token_id=None, params=GREEDY)
    assert any(t >= len(tiny_tokenizer) for row in out.tokens for t in row)


@pytest.mark.parametrize("params", [GREEDY, SamplingParams(), SamplingParams(temperature=0.7, top_p=0.9)])
def test_sampled_ids_stay_below_the_tokenizer_vocabulary(padded_model, tiny_tokenizer, params):
    size = len(tiny_tokenizer)
    out = generate(padded_model, _prompts(size), max_new_tokens=6, eos_token_id=None, params=params,
                   generator=torch.Generator().manual_seed(1), vocab_size=size)
    assert all(0 <= t < size for row in out.tokens for t in row)
    assert all(torch.isfinite(lp).all() for lp in out.logprobs)


def test_local_llm_masks_by_the_tokenizer_size(padded_model, tiny_tokenizer):
    llm = LocalLLM(padded_model, tiny_tokenizer, params=SamplingParams(), generator=torch.Generator().manual_seed(2))
    requests = [ChatRequest(messages=({"role": "user", "content": f"question {i}"},), max_new_tokens=8)
                for i in range(3)]
    completions = llm.complete(requests)
    assert all(t < len(tiny_tokenizer) for c in completions for t in c.response_ids)


@pytest.mark.parametrize("chunk", [1, 4, 7])
def test_chunked_prefill_equals_one_shot_prefill(tiny_model, chunk):
    with torch.no_grad():
        for p in tiny_model.parameters():
            if p.dim() == 2:
                p.mul_(6.0)  # sharper logits: varied greedy continuations, so a position bug shows
    prompts = _prompts(tiny_model.config.vocab_size)
    one_shot = generate(tiny_model, prompts, max_new_tokens=8, eos_token_id=None, params=GREEDY)
    chunked = generate(tiny_model, prompts, max_new_tokens=8, eos_token_id=None, params=GREEDY,
                       prefill_chunk_tokens=chunk)
    assert chunked.tokens == one_shot.tokens
    for a, b in zip(chunked.logprobs, one_shot.logprobs):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_negative_prefill_chunk_and_vocab_size_are_refused(tiny_model):
    with pytest.raises(ValueError, match="prefill_chunk_tokens"):
        generate(tiny_model, [[1, 2]], max_new_tokens=1, eos_token_id=None, prefill_chunk_tokens=-1)
    with pytest.raises(ValueError, match="vocab_size"):
        generate(tiny_model, [[1, 2]], max_new_tokens=1, eos_token_id=None, vocab_size=0)


def _batch_sizes_of_generate_calls(model) -> list[int]:
    """Records the batch size of every prefill forward (a forward over more than one position)."""
    sizes: list[int] = []
    model.register_forward_pre_hook(
        lambda module, args, kwargs: sizes.append(kwargs["input_ids"].shape[0])
        if kwargs["input_ids"].shape[1] > 1 else None, with_kwargs=True)
    return sizes


def test_kv_cache_budget_sets_rows_per_call_under_the_hard_cap(tiny_model, tiny_tokenizer):
    shape = shape_from_config(tiny_model.config.to_dict())
    requests = [ChatRequest(messages=({"role": "user", "content": f"q {i}"},), max_new_tokens=4) for i in range(7)]
    longest = max(len(LocalLLM(tiny_model, tiny_tokenizer).render(r)) for r in requests) + 4
    per_row = kv_bytes_per_token(shape, 4) * longest + prefill_activation_bytes(shape, 1, longest, 4)
    sizes = _batch_sizes_of_generate_calls(tiny_model)
    LocalLLM(tiny_model, tiny_tokenizer, kv_cache_budget_bytes=3.5 * per_row).complete(requests)
    assert sizes == [3, 3, 1]
    sizes.clear()
    LocalLLM(tiny_model, tiny_tokenizer, kv_cache_budget_bytes=3.5 * per_row, max_batch_rows=2).complete(requests)
    assert sizes == [2, 2, 2, 1]


def test_heldout_evaluation_respects_the_rows_per_call_cap(tiny_model, tiny_tokenizer):
    from memagent.records import Sample
    from memagent.rollout.prompts import WorkflowConfig
    from memagent.training.heldout import heldout_metrics

    samples = [Sample(context=f"the code of key {i} is {i * 7}. " * 6, question=f"code of key {i}?", answers=[str(i)])
               for i in range(5)]
    memory = WorkflowConfig(chunk_tokens=48, memory_tokens=4, answer_tokens=4, question_tokens=32)
    sizes = _batch_sizes_of_generate_calls(tiny_model)
    kw = dict(rank=0, world_size=1, all_reduce_sum=lambda t: t)
    heldout_metrics(tiny_model, tiny_tokenizer, samples, memory, GREEDY, **kw)
    assert max(sizes) == 5  # uncapped: every question of a round in one call
    sizes.clear()
    heldout_metrics(tiny_model, tiny_tokenizer, samples, memory, GREEDY, max_batch_rows=2, **kw)
    assert sizes and max(sizes) == 2
