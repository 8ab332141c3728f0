"""Entropy from logits: docs/rl-math.md §6 property 22."""

from __future__ import annotations

import math

import torch
from hypothesis import given
from hypothesis import strategies as st

from memagent.rl import entropy_from_logits

from .batches import FAST

logit_rows = st.integers(1, 12).flatmap(
    lambda v: st.lists(st.lists(st.floats(-30.0, 30.0), min_size=v, max_size=v), min_size=1, max_size=4)
)


@FAST
@given(logit_rows)
def test_entropy_between_zero_and_log_vocab(rows):
    z = torch.tensor(rows, dtype=torch.float64)
    h = entropy_from_logits(z)
    assert h.shape == z.shape[:-1]
    assert bool((h >= -1e-12).all()) and bool((h <= math.log(z.shape[-1]) + 1e-12).all())


@FAST
@given(logit_rows)
def test_entropy_matches_minus_sum_p_log_p(rows):
    z = torch.tensor(rows, dtype=torch.float64)
    p = torch.softmax(z, -1)
    expected = -(torch.special.xlogy(p, p)).sum(-1)
    assert torch.allclose(entropy_from_logits(z), expected, rtol=1e-9, atol=1e-12)


@FAST
@given(st.integers(1, 64), st.floats(-50.0, 50.0))
def test_uniform_logits_give_log_vocab(vocab, value):
    h = entropy_from_logits(torch.full((2, 3, vocab), value, dtype=torch.float64))
    assert torch.allclose(h, torch.full((2, 3), math.log(vocab), dtype=torch.float64), rtol=1e-12, atol=1e-12)


@FAST
@given(logit_rows, st.floats(-1e3, 1e3))
def test_entropy_invariant_to_adding_a_constant(rows, c):
    z = torch.tensor(rows, dtype=torch.float64)
    assert torch.allclose(entropy_from_logits(z + c), entropy_from_logits(z), rtol=1e-9, atol=1e-9)


def test_entropy_of_half_precision_logits_is_float32():
    z = torch.randn(3, 7).to(torch.bfloat16)
    h = entropy_from_logits(z)
    assert h.dtype == torch.float32
    assert torch.allclose(h, entropy_from_logits(z.double()).float(), atol=1e-5)
