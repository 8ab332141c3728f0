"""Fixtures of the engine tests."""

from __future__ import annotations

import pytest
import torch
from transformers import PreTrainedModel

from memagent.rollout.kv_cache import cache_bytes


@pytest.fixture
def model(tiny_model: PreTrainedModel) -> PreTrainedModel:
    """The tiny model with its matrices scaled 6x.

    At the default init the random model repeats one token forever, which would let a position or mask bug go
    unseen; sharper logits give varied greedy continuations.
    """
    with torch.no_grad():
        for p in tiny_model.parameters():
            if p.dim() == 2:
                p.mul_(6.0)
    return tiny_model


class CacheMeter:
    """The most bytes a generation's KV cache held after any forward of the model (`cache_bytes`)."""

    def __init__(self, model: PreTrainedModel) -> None:
        self.peak = 0
        self.handle = model.register_forward_hook(self._measure, with_kwargs=True)

    def _measure(self, _module, _args, kwargs, _output) -> None:
        self.peak = max(self.peak, cache_bytes(kwargs["cache"]))


@pytest.fixture
def cache_meter(model: PreTrainedModel):
    """A CacheMeter on the test's model, removed after the test."""
    meter = CacheMeter(model)
    yield meter
    meter.handle.remove()
