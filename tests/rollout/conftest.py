"""Fixtures of the engine tests."""

from __future__ import annotations

import pytest
import torch
from transformers import PreTrainedModel


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
