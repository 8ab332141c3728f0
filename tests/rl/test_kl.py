"""KL estimators: docs/rl-math.md §6 properties 20-21."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from memagent.rl import kl_penalty

from .batches import FAST, grad_of

log_probs = st.lists(st.floats(-8.0, 0.0), min_size=1, max_size=16)
ALIASES = [("kl", "k1"), ("mse", "k2"), ("low_var_kl", "k3")]


@FAST
@given(log_probs, st.sampled_from(["k1", "k2", "k3", "k3+", "kl", "mse", "low_var_kl"]))
def test_kl_is_zero_when_policy_equals_reference(lp, kind):
    x = torch.tensor(lp, dtype=torch.float64)
    assert bool((kl_penalty(x, x.clone(), kind) == 0).all())


@FAST
@given(log_probs, log_probs)
def test_k2_and_k3_are_non_negative(a, b):
    n = min(len(a), len(b))
    x, y = torch.tensor(a[:n], dtype=torch.float64), torch.tensor(b[:n], dtype=torch.float64)
    for kind in ("k2", "k3", "k3+"):
        assert bool((kl_penalty(x, y, kind) >= 0).all())


@FAST
@given(st.lists(st.floats(-15.0, 15.0), min_size=1, max_size=16))
def test_kl_gradients_match_their_formulas(deltas):
    delta = torch.tensor(deltas, dtype=torch.float64)
    ref = torch.full_like(delta, -2.0)
    grads = {}
    for kind in ("k1", "k2", "k3", "k3+"):
        logp = (ref + delta).requires_grad_(True)
        grads[kind] = grad_of(kl_penalty(logp, ref, kind).sum(), logp)
    d = (ref + delta) - ref
    assert torch.allclose(grads["k1"], torch.ones_like(d))
    assert torch.allclose(grads["k2"], d, rtol=1e-12)
    k3 = torch.exp(-d) - 1 + d
    expected_k3 = torch.where(k3.abs() < 10, 1 - torch.exp(-d), torch.zeros_like(d))  # 0 where the clamp bites
    assert torch.allclose(grads["k3"], expected_k3, rtol=1e-12, atol=1e-15)
    assert torch.allclose(grads["k3+"], d, rtol=1e-12), "k3+ is straight-through: k2's gradient"


@FAST
@given(st.lists(st.floats(-15.0, 15.0), min_size=1, max_size=16))
def test_k3_plus_has_k3_value(deltas):
    delta = torch.tensor(deltas, dtype=torch.float64)
    assert torch.allclose(kl_penalty(delta, torch.zeros_like(delta), "k3+"), kl_penalty(delta, torch.zeros_like(delta)))


def test_k3_is_clamped_and_k3_minus_k2_is_third_order():
    delta = torch.tensor([-30.0, 30.0, 1e3], dtype=torch.float64)
    k3 = kl_penalty(delta, torch.zeros_like(delta), "k3")
    assert bool((k3.abs() <= 10).all()) and bool(torch.isfinite(k3).all())
    small = torch.tensor([1e-2, -1e-2, 3e-3], dtype=torch.float64)
    diff = kl_penalty(small, torch.zeros_like(small), "k3") - kl_penalty(small, torch.zeros_like(small), "k2")
    assert torch.allclose(diff, -small**3 / 6, rtol=0.05)


@pytest.mark.parametrize(("alias", "kind"), ALIASES)
def test_kl_aliases_name_the_same_estimator(alias, kind):
    x = torch.linspace(-3, 0, 7, dtype=torch.float64)
    y = torch.linspace(-1, -2, 7, dtype=torch.float64)
    assert torch.equal(kl_penalty(x, y, alias), kl_penalty(x, y, kind))


@FAST
@given(st.integers(0, 2**31 - 1), st.integers(2, 8))
def test_kl_expectations_by_exact_enumeration(seed, vocab):
    g = torch.Generator().manual_seed(seed)
    # Scaled so every |delta| stays small enough that k3's cap at 10 never bites (it would bias the mean).
    z = (0.5 * torch.randn(vocab, generator=g, dtype=torch.float64)).requires_grad_(True)
    ref = torch.log_softmax(0.5 * torch.randn(vocab, generator=g, dtype=torch.float64), -1)

    def policy_logp() -> torch.Tensor:
        return torch.log_softmax(z, -1)

    logp = policy_logp()
    p = logp.exp()
    kl = (p * (logp - ref)).sum()
    with torch.no_grad():
        mean_k1 = float((p * kl_penalty(logp, ref, "k1")).sum())
        # Under samples from pi, k3's mean is KL(pi || ref) too: sum_v pi (ref/pi - 1 + log pi/ref) = KL.
        mean_k3 = float((p * kl_penalty(logp, ref, "k3")).sum())
    assert math.isclose(mean_k1, float(kl.detach()), rel_tol=1e-10, abs_tol=1e-12)
    assert math.isclose(mean_k3, float(kl.detach()), rel_tol=1e-10, abs_tol=1e-12)
    # Score-function identity: E_pi[grad k2(y)] taken with pi's samples fixed equals grad KL(pi || ref).
    k2_grad = sum(p[v].detach() * grad_of(kl_penalty(policy_logp()[v:v + 1], ref[v:v + 1], "k2").sum(), z)
                  for v in range(vocab))
    assert torch.allclose(k2_grad, grad_of(kl, z), rtol=1e-9, atol=1e-12)
