"""The in-place KV cache and lazy row compaction give the same generations as transformers' DynamicCache; the
cache grows in blocks, so rows that stop early do not pay for max_new_tokens."""

from __future__ import annotations

import importlib

import pytest
import torch
from transformers import DynamicCache, PreTrainedModel

from memagent.model.shape import kv_bytes_per_token, shape_from_config
from memagent.rollout import SamplingParams, generate
from memagent.rollout.kv_cache import GROW_BLOCK, PreallocatedLayer, preallocated_cache

# The package re-exports the function `generate` under the submodule's name, so fetch the module itself.
engine = importlib.import_module("memagent.rollout.generate")

GREEDY = SamplingParams(temperature=0.0)
LIMITS = [3, 9, 5, 12, 9, 10, 7, 4]


@pytest.fixture
def prompts(model: PreTrainedModel) -> list[list[int]]:
    """Eight prompts of different lengths (left padding differs per row), two of them equal (shared prefill)."""
    g = torch.Generator().manual_seed(1)
    rows = [torch.randint(3, model.config.vocab_size, (n,), generator=g).tolist() for n in (5, 11, 3, 8, 6, 9, 4)]
    return rows + [list(rows[1])]


def stop_ids(model: PreTrainedModel, prompts: list[list[int]]) -> list[int]:
    """Two tokens greedy decoding produces mid-sequence, so several rows stop on EOS at different steps."""
    out = generate(model, prompts, max_new_tokens=12, eos_token_id=None, params=GREEDY, preallocate_kv=False)
    return [out.tokens[0][2], out.tokens[3][4]]


@pytest.mark.parametrize("chunk", [0, 4])
@pytest.mark.parametrize("share", [False, True])
def test_in_place_cache_gives_the_same_greedy_tokens_and_logprobs_as_dynamic_cache(model, prompts, chunk, share):
    kwargs = dict(max_new_tokens=LIMITS, eos_token_id=stop_ids(model, prompts), params=GREEDY,
                  prefill_chunk_tokens=chunk, share_prefill=share)
    dynamic = generate(model, prompts, preallocate_kv=False, **kwargs)
    in_place = generate(model, prompts, preallocate_kv=True, **kwargs)
    assert in_place.tokens == dynamic.tokens
    assert in_place.finished == dynamic.finished
    assert any(in_place.finished) and not all(in_place.finished)
    for a, b in zip(in_place.logprobs, dynamic.logprobs):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


def test_in_place_cache_gives_the_same_sampled_tokens_for_the_same_seed(model, prompts):
    eos = stop_ids(model, prompts)
    outs = [
        generate(model, prompts, max_new_tokens=LIMITS, eos_token_id=eos, preallocate_kv=pre,
                 generator=torch.Generator().manual_seed(7))
        for pre in (False, True)
    ]
    assert outs[0].tokens == outs[1].tokens


def test_each_row_decodes_as_if_it_were_alone_whatever_the_batch_does(model, prompts):
    """Rows that stopped but stay in the batch (lazy compaction) must not change the others' greedy tokens."""
    eos = stop_ids(model, prompts)
    batched = generate(model, prompts, max_new_tokens=LIMITS, eos_token_id=eos, params=GREEDY)
    for i, prompt in enumerate(prompts):
        alone = generate(model, [prompt], max_new_tokens=LIMITS[i], eos_token_id=eos, params=GREEDY)
        assert batched.tokens[i] == alone.tokens[0], i
        assert batched.finished[i] == alone.finished[0], i
        assert len(batched.tokens[i]) <= LIMITS[i]


def test_stopped_rows_leave_the_batch_only_once_they_are_a_quarter_of_it(model, prompts):
    eos = stop_ids(model, prompts)
    rows_per_forward: list[int] = []
    handle = model.register_forward_pre_hook(
        lambda _m, _a, kw: rows_per_forward.append(kw["input_ids"].shape[0]), with_kwargs=True
    )
    try:
        out = generate(model, prompts, max_new_tokens=LIMITS, eos_token_id=eos, params=GREEDY, share_prefill=False)
    finally:
        handle.remove()
    decode_batches = rows_per_forward[1:]  # the first forward is the one-shot prefill
    lengths = [len(t) for t in out.tokens]
    resident = len(prompts)
    for step, rows in enumerate(decode_batches, start=1):
        # Before decode forward `step`, rows that stopped at or before `step` have produced their last token.
        stopped = sum(n <= step for n in lengths)
        assert rows >= len(prompts) - stopped  # every running row is in the batch
        if rows < resident:  # a compaction happened: it removed at least a quarter of the batch at once
            assert resident - rows >= resident / 4
            assert rows == len(prompts) - stopped  # and it removed every stopped row
        resident = rows
    assert min(decode_batches) < len(prompts)  # compaction did happen in this case


def test_the_cache_buffers_are_written_in_place_across_decode_steps(model):
    cache = preallocated_cache(model.config, capacity=20)
    assert all(isinstance(layer, PreallocatedLayer) for layer in cache.layers)
    ids = torch.randint(3, model.config.vocab_size, (2, 6))
    with torch.inference_mode():
        model(input_ids=ids, cache=cache, use_cache=True)
        buffer = cache.layers[0].key_buffer.data_ptr()
        reference = DynamicCache(config=model.config)
        model(input_ids=ids, cache=reference, use_cache=True)
        for k in range(3):
            step = ids[:, k : k + 1]
            model(input_ids=step, cache=cache, use_cache=True)
            model(input_ids=step, cache=reference, use_cache=True)
    assert cache.layers[0].key_buffer.data_ptr() == buffer
    assert cache.get_seq_length() == 9
    for ours, theirs in zip(cache.layers, reference.layers):
        torch.testing.assert_close(ours.keys, theirs.keys)
        torch.testing.assert_close(ours.values, theirs.values)


def test_a_preallocated_layer_refuses_to_grow_past_its_capacity():
    layer = PreallocatedLayer(capacity=4)
    layer.update(torch.zeros(1, 2, 3, 8), torch.zeros(1, 2, 3, 8))
    layer.update(torch.ones(1, 2, 1, 8), torch.ones(1, 2, 1, 8))
    with pytest.raises(RuntimeError, match="capacity of 4"):
        layer.update(torch.ones(1, 2, 1, 8), torch.ones(1, 2, 1, 8))


def test_row_selection_keeps_the_chosen_rows_in_order():
    layer = PreallocatedLayer(capacity=5)
    keys = torch.arange(3.0)[:, None, None, None].expand(3, 1, 2, 4).clone()
    layer.update(keys, -keys)
    layer.reorder_cache(torch.tensor([2, 2, 0]))
    assert layer.keys[:, 0, 0, 0].tolist() == [2.0, 2.0, 0.0]
    layer.batch_select_indices(torch.tensor([2]))
    assert layer.values[:, 0, 0, 0].tolist() == [-0.0]
    layer.update(torch.full((1, 1, 1, 4), 9.0), torch.full((1, 1, 1, 4), 9.0))
    assert layer.get_seq_length() == 3 and layer.keys.shape == (1, 1, 3, 4)


def test_a_layer_grows_a_block_at_a_time_up_to_its_capacity_and_keeps_what_it_held():
    layer = PreallocatedLayer(capacity=11, reserve=4, block=3)
    g = torch.Generator().manual_seed(0)
    written, allocated = [], []
    for n in (3, 1, 1, 2, 1, 3):  # filled lengths 3, 4, 5, 7, 8, 11
        keys, values = torch.randn(2, 1, n, 4, generator=g), torch.randn(2, 1, n, 4, generator=g)
        layer.update(keys, values)
        written.append((keys, values))
        allocated.append(layer.allocated)
    assert allocated == [4, 4, 7, 7, 10, 11]  # grows by max(block, what the write needs), never past capacity
    assert torch.equal(layer.keys, torch.cat([k for k, _ in written], dim=2))
    assert torch.equal(layer.values, torch.cat([v for _, v in written], dim=2))
    with pytest.raises(RuntimeError, match="capacity of 11"):
        layer.update(torch.ones(2, 1, 1, 4), torch.ones(2, 1, 1, 4))


@pytest.mark.parametrize("share", [False, True])
def test_greedy_generation_is_bit_identical_when_the_cache_grows_every_two_steps(model, prompts, monkeypatch, share):
    kwargs = dict(max_new_tokens=LIMITS, eos_token_id=stop_ids(model, prompts), params=GREEDY, share_prefill=share)
    one_buffer = generate(model, prompts, **kwargs)  # LIMITS < GROW_BLOCK: the first buffer is the last
    monkeypatch.setattr(engine, "GROW_BLOCK", 2)
    growing = generate(model, prompts, **kwargs)
    dynamic = generate(model, prompts, preallocate_kv=False, **kwargs)
    assert growing.tokens == one_buffer.tokens == dynamic.tokens
    assert growing.finished == one_buffer.finished
    for a, b in zip(growing.logprobs, one_buffer.logprobs):
        assert torch.equal(a, b)


def test_rows_that_stop_early_hold_a_block_of_cache_not_max_new_tokens(model, prompts, cache_meter):
    """Issue 23: every row got prompt width + the call's max_new_tokens of cache, used or not."""
    first = generate(model, prompts, max_new_tokens=1, eos_token_id=None, params=GREEDY)
    firsts = {t[0] for t in first.tokens}
    # Every token but the rows' first ones ends a row: each row stops at its second or third token.
    eos = [i for i in range(model.config.vocab_size) if i not in firsts]
    out = generate(model, prompts, max_new_tokens=5000, eos_token_id=eos, params=GREEDY)
    assert all(f for f in out.finished) and max(len(t) for t in out.tokens) <= 3
    per_token = kv_bytes_per_token(shape_from_config(model.config.to_dict()), dtype_bytes=4)
    width = max(map(len, prompts))
    assert cache_meter.peak > 0
    assert cache_meter.peak <= len(prompts) * (width + GROW_BLOCK) * per_token  # was 8 x (11 + 5000) positions
