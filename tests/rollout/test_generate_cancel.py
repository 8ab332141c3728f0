"""Cancelling rows (the server's timed-out requests): a cancelled row stops at the next decode step and leaves the
batch, and the other rows decode exactly what they would have without it."""

from __future__ import annotations

import threading

import pytest
import torch
from transformers import PreTrainedModel

from memagent.rollout import SamplingParams, generate

GREEDY = SamplingParams(temperature=0.0)
STEPS = 20


@pytest.fixture
def prompts(model: PreTrainedModel) -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(3, model.config.vocab_size, (n,), generator=g).tolist() for n in (5, 9, 3, 7)]


def test_row_cancelled_mid_decode_stops_at_the_next_step_and_leaves_the_batch(model, prompts):
    reference = generate(model, prompts, max_new_tokens=STEPS, eos_token_id=None, params=GREEDY)
    cancel_at = 5
    cancelled = [threading.Event() for _ in prompts]
    rows_per_forward: list[int] = []

    def count_rows_and_cancel(_module, _args, kwargs):
        rows_per_forward.append(kwargs["input_ids"].shape[0])
        if len(rows_per_forward) == 1 + cancel_at:  # the prefill, then the 5th decode forward
            cancelled[2].set()

    handle = model.register_forward_pre_hook(count_rows_and_cancel, with_kwargs=True)
    try:
        out = generate(model, prompts, max_new_tokens=STEPS, eos_token_id=None, params=GREEDY, cancelled=cancelled)
    finally:
        handle.remove()
    # The step in flight when the event was set still samples its token; none after it.
    assert out.tokens[2] == reference.tokens[2][: cancel_at + 1]
    assert out.logprobs[2].shape == (cancel_at + 1,) and not out.finished[2]
    for row in (0, 1, 3):
        assert out.tokens[row] == reference.tokens[row]
        torch.testing.assert_close(out.logprobs[row], reference.logprobs[row])
    assert rows_per_forward == [4] * (1 + cancel_at) + [3] * (STEPS - 1 - cancel_at)


def test_row_cancelled_before_the_call_never_enters_the_batch(model, prompts):
    cancelled = [threading.Event() for _ in prompts]
    cancelled[1].set()
    rows_per_forward: list[int] = []
    handle = model.register_forward_pre_hook(
        lambda _module, _args, kwargs: rows_per_forward.append(kwargs["input_ids"].shape[0]), with_kwargs=True)
    try:
        out = generate(model, prompts, max_new_tokens=4, eos_token_id=None, params=GREEDY, cancelled=cancelled)
    finally:
        handle.remove()
    assert out.tokens[1] == [] and not out.finished[1]
    assert all(len(out.tokens[row]) == 4 for row in (0, 2, 3))
    assert set(rows_per_forward) == {3}
