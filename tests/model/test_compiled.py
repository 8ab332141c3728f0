"""The compiled fast path (memagent.model.compiled) equals the eager model it wraps, in float32.

Inductor on a CPU writes C++ and builds it, so these tests need a C++ compiler; without one they skip, saying so.
"""

from __future__ import annotations

import shutil

import pytest
import torch

from memagent.model import load_model
from memagent.model.compiled import compile_elementwise, elementwise_modules
from memagent.model.logprobs import token_logprobs
from memagent.model.shared_prefix import shared_prefix_logprobs
from memagent.rollout.generate import generate
from memagent.rollout.sampling import SamplingParams

pytestmark = pytest.mark.skipif(shutil.which("c++") is None and shutil.which("g++") is None,
                                reason="torch.compile's CPU backend needs a C++ compiler on PATH")


def eager_and_compiled(model_dir):
    eager = load_model(model_dir, dtype=torch.float32, device="cpu")
    compiled = load_model(model_dir, dtype=torch.float32, device="cpu")
    count = compile_elementwise(compiled)
    # each layer's MLP and two norms, and the final norm
    assert count == 3 * compiled.config.num_hidden_layers + 1 == len(elementwise_modules(compiled))
    return eager, compiled


def rows(vocab: int, lengths: tuple[int, ...], seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded [B, T] ids and mask with the given real lengths."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for r, n in enumerate(lengths):
        ids[r, :n] = torch.randint(3, vocab, (n,), generator=g)
        mask[r, :n] = 1
    return ids, mask


def test_compiled_logprobs_and_gradients_equal_the_eager_model_over_varying_shapes(tiny_model_dir) -> None:
    eager, compiled = eager_and_compiled(tiny_model_dir)
    eager.train()
    compiled.train()
    vocab = eager.config.vocab_size
    # three micro-batches of different shapes: the dynamic graph must serve all of them
    for seed, lengths in enumerate([(17, 9, 12), (30, 4), (8, 8, 8, 5)]):
        ids, mask = rows(vocab, lengths, seed)
        prefix = torch.randint(3, vocab, (11,), generator=torch.Generator().manual_seed(100 + seed))
        weights = torch.randn(ids.shape, generator=torch.Generator().manual_seed(200 + seed))
        for model in (eager, compiled):
            plain = token_logprobs(model, ids, mask, temperature=0.7, with_entropy=True).logprobs
            shared = shared_prefix_logprobs(model, prefix, ids, mask, temperature=0.7).logprobs
            ((plain + shared) * weights).sum().backward()
        want = token_logprobs(eager, ids, mask, temperature=0.7).logprobs.detach()
        got = token_logprobs(compiled, ids, mask, temperature=0.7).logprobs.detach()
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    for (name, a), (_, b) in zip(compiled.named_parameters(), eager.named_parameters()):
        tol = 1e-5 * float(b.grad.abs().max())
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=tol, msg=lambda m, name=name: f"{name}: {m}")


def test_compiled_greedy_generation_equals_hf_generate_of_the_eager_model(tiny_model_dir) -> None:
    eager, compiled = eager_and_compiled(tiny_model_dir)
    prompts = [rows(eager.config.vocab_size, (n,), seed)[0][0].tolist() for seed, n in enumerate((9, 14, 5))]
    steps = 10
    out = generate(compiled, prompts, max_new_tokens=steps, eos_token_id=None, params=SamplingParams(temperature=0.0))
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    hf = eager.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=steps, pad_token_id=0)
    assert out.tokens == hf[:, width:].tolist()


def test_a_model_without_mlp_or_rmsnorm_modules_is_refused_naming_the_flag() -> None:
    with pytest.raises(ValueError, match="model.compile: Sequential"):
        compile_elementwise(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.LayerNorm(2)))
