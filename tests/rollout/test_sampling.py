"""Properties of memagent.rollout.sampling: the draws follow the truncated softmax, the log-probs are its logs."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from memagent.rollout import sampling
from memagent.rollout.sampling import SamplingParams, sample_next_token

LOGITS8 = torch.tensor([2.0, 1.5, 1.2, 0.4, 0.0, -0.3, -1.0, -2.5])


def reference_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The intended distribution, spelled out with a full sort: temperature, top-k, top-p, min-p, renormalize.

    logits: [B, V] -> probabilities [B, V] float64.
    """
    probs = torch.softmax(logits.double() / params.temperature, -1)
    sorted_p, order = probs.sort(-1, descending=True)
    keep = torch.ones_like(sorted_p, dtype=torch.bool)
    if params.top_k > 0:
        keep[:, params.top_k :] = False
    sorted_p = torch.where(keep, sorted_p, 0.0)
    sorted_p = sorted_p / sorted_p.sum(-1, keepdim=True)
    if params.top_p < 1:
        keep &= sorted_p.cumsum(-1) - sorted_p < params.top_p
    if params.min_p > 0:
        keep &= sorted_p >= params.min_p * sorted_p[:, :1]
    kept = torch.where(keep, sorted_p, 0.0)
    out = torch.zeros_like(probs).scatter_(-1, order, kept)
    return out / out.sum(-1, keepdim=True)


def chi_square_pvalue(counts: torch.Tensor, expected_probs: torch.Tensor) -> float:
    """Pearson chi-square goodness-of-fit p-value over the support of expected_probs (both [V])."""
    support = expected_probs > 0
    n = counts.sum().double()
    expected = expected_probs[support] * n
    stat = ((counts[support].double() - expected) ** 2 / expected).sum()
    dof = int(support.sum()) - 1
    if dof == 0:
        return 1.0
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), stat / 2))


@pytest.mark.parametrize(
    "kwargs",
    [{"temperature": -0.1}, {"temperature": math.inf}, {"top_k": -1}, {"top_p": 0.0}, {"top_p": 1.5},
     {"min_p": -0.1}, {"min_p": 1.0}],
)
def test_sampling_params_reject_out_of_range_values(kwargs: dict) -> None:
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        SamplingParams(**kwargs)


def test_bad_logits_or_temperature_shapes_raise() -> None:
    with pytest.raises(ValueError, match="logits"):
        sample_next_token(torch.zeros(8), SamplingParams())
    with pytest.raises(ValueError, match="temperature"):
        sample_next_token(torch.zeros(2, 8), SamplingParams(), temperature=torch.ones(3))


def test_greedy_returns_argmax_with_untruncated_t1_logprob() -> None:
    logits = torch.randn(5, 50, generator=torch.Generator().manual_seed(0))
    ids, logprobs = sample_next_token(logits, SamplingParams(temperature=0.0, top_p=0.5, top_k=3))
    assert torch.equal(ids, logits.argmax(-1))
    torch.testing.assert_close(logprobs, logits.log_softmax(-1).gather(-1, ids[:, None]).squeeze(-1))


@pytest.mark.parametrize(
    "params",
    [SamplingParams(), SamplingParams(temperature=0.7, top_p=0.9), SamplingParams(top_k=5, min_p=0.05)],
)
def test_seeded_sampling_is_reproducible_and_seeds_differ(params: SamplingParams) -> None:
    logits = torch.randn(64, 300, generator=torch.Generator().manual_seed(1))
    a = sample_next_token(logits, params, torch.Generator().manual_seed(7))
    b = sample_next_token(logits, params, torch.Generator().manual_seed(7))
    c = sample_next_token(logits, params, torch.Generator().manual_seed(8))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], c[0])


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(),
        SamplingParams(temperature=0.6),
        SamplingParams(top_k=3),
        SamplingParams(top_p=0.75),
        SamplingParams(temperature=1.5, top_p=0.9),
        SamplingParams(min_p=0.3),
        SamplingParams(top_k=6, top_p=0.8, min_p=0.1),
    ],
)
def test_draws_follow_the_truncated_softmax_and_never_leave_its_support(params: SamplingParams) -> None:
    draws = 20_000
    logits = LOGITS8.expand(draws, -1)
    ids, _ = sample_next_token(logits, params, torch.Generator().manual_seed(0))
    expected = reference_probs(LOGITS8[None], params)[0]
    counts = torch.bincount(ids, minlength=8)
    assert (counts[expected == 0] == 0).all(), "a token outside the truncation was drawn"
    assert chi_square_pvalue(counts, expected) > 1e-6


@pytest.mark.parametrize("params", [SamplingParams(), SamplingParams(top_p=0.75), SamplingParams(min_p=0.3)])
def test_two_level_draw_on_a_wide_vocabulary_follows_the_truncated_softmax(params: SamplingParams) -> None:
    # 2500 tokens: ten blocks of DRAW_BLOCK and a short last one; the mass sits on 8 tokens spread over the
    # blocks (two in the short one), every other token is impossible.
    vocab, draws = 2500, 20_000
    assert vocab > 4 * sampling.DRAW_BLOCK and vocab % sampling.DRAW_BLOCK
    where = torch.tensor([0, 255, 256, 777, 1024, 2047, 2490, 2499])
    logits = torch.full((1, vocab), -math.inf).index_copy_(1, where, LOGITS8[None])
    ids, logprobs = sample_next_token(logits.expand(draws, -1), params, torch.Generator().manual_seed(11))
    expected = reference_probs(logits, params)[0]
    counts = torch.bincount(ids, minlength=vocab)
    assert (counts[expected == 0] == 0).all(), "an impossible or truncated token was drawn"
    assert chi_square_pvalue(counts[where], expected[where]) > 1e-6
    torch.testing.assert_close(logprobs.double(), expected[ids].log(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "params",
    [SamplingParams(temperature=0.8), SamplingParams(top_k=4), SamplingParams(temperature=1.3, top_p=0.7),
     SamplingParams(min_p=0.2), SamplingParams(top_k=5, top_p=0.6, min_p=0.1)],
)
def test_logprobs_are_logs_of_the_sampled_distribution(params: SamplingParams) -> None:
    logits = torch.randn(256, 40, generator=torch.Generator().manual_seed(2)) * 2
    ids, logprobs = sample_next_token(logits, params, torch.Generator().manual_seed(3))
    expected = reference_probs(logits, params).gather(-1, ids[:, None]).squeeze(-1).log()
    assert logprobs.dtype == torch.float32
    torch.testing.assert_close(logprobs.double(), expected, atol=1e-5, rtol=1e-5)


def test_plain_sampling_logprobs_equal_log_softmax_of_scaled_logits() -> None:
    logits = torch.randn(32, 32000, generator=torch.Generator().manual_seed(4))
    ids, logprobs = sample_next_token(logits, SamplingParams(temperature=0.7), torch.Generator().manual_seed(5))
    torch.testing.assert_close(logprobs, (logits / 0.7).log_softmax(-1).gather(-1, ids[:, None]).squeeze(-1))


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    vocab=st.sampled_from([sampling.HISTOGRAM_MIN_VOCAB, 3000, 20_000]),  # the three bucket widths
    scale=st.sampled_from([0.05, 0.3, 1.0, 3.0, 10.0]),
    top_p=st.floats(0.05, 0.99),
)
def test_histogram_top_p_cutoff_equals_full_sort_cutoff(seed: int, vocab: int, scale: float, top_p: float) -> None:
    logits = torch.randn(4, vocab, generator=torch.Generator().manual_seed(seed)) * scale
    weights = (logits - logits.amax(-1, keepdim=True)).exp()
    sorted_w = weights.sort(-1, descending=True).values
    fast = sampling._histogram_cutoff(weights, top_p)
    exact = sampling._sorted_cutoff(sorted_w, top_p)
    kept_fast, kept_exact = (weights >= fast).sum(-1), (weights >= exact).sum(-1)
    # The two sum the same masses in different orders; a row may differ only where float32 rounding decides,
    # i.e. where the target sits within rounding error of a cumulative mass.
    cum = sorted_w.double().cumsum(-1)
    target = top_p * cum[:, -1]
    for row in torch.nonzero(kept_fast != kept_exact).flatten().tolist():
        boundary = cum[row, min(kept_fast[row], kept_exact[row]) - 1]
        assert abs(boundary - target[row]) < 1e-5 * cum[row, -1], f"row {row}: {kept_fast[row]} vs {kept_exact[row]}"


@pytest.mark.parametrize("uniform", [0.0, 1.0 - 2.0**-24])
def test_extreme_uniforms_never_draw_zero_weight_tokens(monkeypatch: pytest.MonkeyPatch, uniform: float) -> None:
    weights = torch.tensor([[0.0, 0.5, 0.25, 0.0], [0.0, 0.0, 1e-30, 0.0], [3.0, 0.0, 0.0, 0.0]])
    monkeypatch.setattr(torch, "rand", lambda shape, **_: torch.full(shape, uniform))
    column, logprobs = sampling._draw(weights, None)
    assert (weights.gather(-1, column[:, None]) > 0).all()
    assert torch.isfinite(logprobs).all()


def test_large_vocabulary_top_p_draws_stay_in_the_nucleus_with_exact_logprobs() -> None:
    logits = torch.randn(128, 20_000, generator=torch.Generator().manual_seed(6)) * 2
    params = SamplingParams(top_p=0.8, min_p=0.01)
    ids, logprobs = sample_next_token(logits, params, torch.Generator().manual_seed(9))
    expected = reference_probs(logits, params)
    picked = expected.gather(-1, ids[:, None]).squeeze(-1)
    assert (picked > 0).all()
    torch.testing.assert_close(logprobs.double(), picked.log(), atol=1e-4, rtol=1e-4)


def test_per_row_temperature_matches_scalar_calls_and_zero_rows_are_greedy() -> None:
    logits = torch.randn(6, 100, generator=torch.Generator().manual_seed(10))
    params = SamplingParams(top_p=0.9)
    same = sample_next_token(logits, params, torch.Generator().manual_seed(1), temperature=torch.full((6,), 0.5))
    scalar = sample_next_token(logits, SamplingParams(temperature=0.5, top_p=0.9), torch.Generator().manual_seed(1))
    assert torch.equal(same[0], scalar[0])
    torch.testing.assert_close(same[1], scalar[1])

    temps = torch.tensor([0.0, 1.0, 0.0, 0.7, 2.0, 0.0])
    ids, logprobs = sample_next_token(logits, params, torch.Generator().manual_seed(1), temperature=temps)
    greedy = temps == 0
    assert torch.equal(ids[greedy], logits[greedy].argmax(-1))
    torch.testing.assert_close(logprobs[greedy], logits[greedy].log_softmax(-1).amax(-1))
    assert torch.isfinite(logprobs).all() and (logprobs <= 0).all()


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    vocab=st.integers(1, 64),
    temperature=st.sampled_from([0.0, 0.3, 1.0, 2.0]),
    top_k=st.integers(0, 70),
    top_p=st.floats(0.01, 1.0),
    min_p=st.floats(0.0, 0.99),
)
def test_any_params_give_valid_ids_inside_the_support(
    seed: int, vocab: int, temperature: float, top_k: int, top_p: float, min_p: float
) -> None:
    logits = torch.randn(8, vocab, generator=torch.Generator().manual_seed(seed)) * 3
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    ids, logprobs = sample_next_token(logits, params, torch.Generator().manual_seed(seed))
    assert ids.dtype == torch.long and ids.shape == (8,)
    assert torch.isfinite(logprobs).all() and (logprobs <= 1e-6).all()
    if temperature > 0:
        assert (reference_probs(logits, params).gather(-1, ids[:, None]) > 0).all()
