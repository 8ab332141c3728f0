"""Generation under bf16 autocast over fp32 weights casts each weight once per call, not once per decode step."""

from __future__ import annotations

import torch
from torch.profiler import profile
from transformers import PreTrainedModel

from memagent.rollout import generate


def weight_casts(model: PreTrainedModel, max_new_tokens: int) -> int:
    """How many casts of a weight matrix (by shape) one autocast generate call runs."""
    shapes = {tuple(p.shape) for p in model.parameters() if p.dim() == 2}
    with torch.autocast("cpu", torch.bfloat16), profile(record_shapes=True) as prof:
        generate(model, [[5, 6, 7], [8, 9]], max_new_tokens=max_new_tokens, eos_token_id=None)
    return sum(
        1 for e in prof.events()
        if e.name == "aten::_to_copy" and e.input_shapes and tuple(e.input_shapes[0]) in shapes
    )


def test_autocast_casts_each_weight_once_per_generate_call_not_once_per_decode_step(tiny_model):
    tiny_model.eval()
    few, many = weight_casts(tiny_model, 2), weight_casts(tiny_model, 12)
    assert few > 0  # the casts are seen at all
    assert many == few  # ten more decode steps cast nothing again
