"""A shared prompt prefix run once gives the plain forward's log-probs, entropies and gradients (float64)."""

from __future__ import annotations

import pytest
import torch

from memagent.model import load_model
from memagent.model.logprobs import token_logprobs
from memagent.model.shared_prefix import shared_prefix_logprobs


def batch(vocab: int, prefix: int = 23, lengths: tuple[int, ...] = (11, 6, 2, 9), seed: int = 0):
    """A [P] prefix and right-padded [B, S] suffixes; also the plain [B, P + S] rows and a target mask that skips
    each suffix's first token (its predictor is the prefix's last position)."""
    g = torch.Generator().manual_seed(seed)
    prefix_ids = torch.randint(3, vocab, (prefix,), generator=g)
    S = max(lengths)
    ids = torch.zeros(len(lengths), S, dtype=torch.long)
    mask = torch.zeros(len(lengths), S, dtype=torch.long)
    for row, n in enumerate(lengths):
        ids[row, :n] = torch.randint(3, vocab, (n,), generator=g)
        mask[row, :n] = 1
    target = mask.bool().clone()
    target[:, 0] = False
    full_ids = torch.cat([prefix_ids.expand(len(lengths), -1), ids], dim=1)
    full_mask = torch.cat([torch.ones(len(lengths), prefix, dtype=torch.long), mask], dim=1)
    full_target = torch.cat([torch.zeros(len(lengths), prefix, dtype=torch.bool), target], dim=1)
    return prefix_ids, ids, mask, target, full_ids, full_mask, full_target


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_shared_prefix_logprobs_and_entropies_equal_the_plain_forward(tiny_model_dir, temperature: float) -> None:
    model = load_model(tiny_model_dir, dtype=torch.float64, device="cpu")
    prefix_ids, ids, mask, target, full_ids, full_mask, full_target = batch(model.config.vocab_size)
    with torch.no_grad():
        got = shared_prefix_logprobs(model, prefix_ids, ids, mask, temperature=temperature, with_entropy=True,
                                     target_mask=target)
        want = token_logprobs(model, full_ids, full_mask, temperature=temperature, with_entropy=True,
                              target_mask=full_target)
    P = prefix_ids.numel()
    assert got.logprobs.shape == ids.shape and bool((got.logprobs[target] != 0).all())
    torch.testing.assert_close(got.logprobs, want.logprobs[:, P:], rtol=0, atol=1e-10)
    torch.testing.assert_close(got.entropy, want.entropy[:, P:], rtol=0, atol=1e-10)


def test_shared_prefix_gradient_reaches_the_weights_through_the_prefix_as_the_plain_one(tiny_model_dir) -> None:
    shared, plain = (load_model(tiny_model_dir, dtype=torch.float64, device="cpu").train() for _ in range(2))
    prefix_ids, ids, mask, target, full_ids, full_mask, full_target = batch(shared.config.vocab_size, seed=1)
    weights = torch.randn(ids.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    P = prefix_ids.numel()
    got = shared_prefix_logprobs(shared, prefix_ids, ids, mask, temperature=0.8, with_entropy=True, target_mask=target)
    (got.logprobs * weights + 0.1 * got.entropy).sum().backward()
    want = token_logprobs(plain, full_ids, full_mask, temperature=0.8, with_entropy=True, target_mask=full_target)
    (want.logprobs[:, P:] * weights + 0.1 * want.entropy[:, P:]).sum().backward()
    first_layer_k = [n for n, _ in shared.named_parameters() if "layers.0" in n and "k_proj.weight" in n]
    assert first_layer_k  # a weight only the prefix's keys reach the loss through, for suffix tokens too
    for (name, a), (_, b) in zip(shared.named_parameters(), plain.named_parameters()):
        # The head's log-softmax runs in float32 whatever the model's dtype (memagent.model.logprobs), so the
        # gradients agree to float32 rounding of each weight's largest entry, not to float64's.
        tol = 1e-6 * float(b.grad.abs().max())
        torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=tol, msg=lambda m, name=name: f"{name}: {m}")


def test_shared_prefix_refuses_gradient_checkpointing(tiny_model_dir) -> None:
    model = load_model(tiny_model_dir, dtype=torch.float32, device="cpu", gradient_checkpointing=True).train()
    prefix_ids, ids, mask, target, *_ = batch(model.config.vocab_size)
    with pytest.raises(ValueError, match="gradient checkpointing"):
        shared_prefix_logprobs(model, prefix_ids, ids, mask, target_mask=target)
