"""The engine, the shared-prefix forward and a bf16 training step on a CUDA device (skipped without one).

The same properties the CPU suite checks, where the kernels differ: SDPA's CUDA kernels, bf16 autocast on a GPU,
a CUDA sampling generator. `bench/gpu_check.sh` runs this group (`pytest -m gpu`) first.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from memagent.model import load_model
from memagent.model.logprobs import token_logprobs
from memagent.model.shared_prefix import shared_prefix_logprobs
from memagent.rollout import generate
from memagent.rollout.sampling import SamplingParams

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
CUDA = torch.device("cuda")


def test_greedy_generate_on_cuda_equals_model_generate(tiny_model_dir: Path) -> None:
    model = load_model(tiny_model_dir, dtype=torch.float32, device="cuda")
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(6.0)  # varied greedy continuations (conftest's `model` fixture does the same on CPU)
    prompts = [[5, 9, 11, 40, 7], [3, 8], [100, 101, 102, 103, 104, 105, 106]]
    ours = generate(model, prompts, max_new_tokens=12, eos_token_id=None, params=SamplingParams(temperature=0.0))
    for prompt, tokens in zip(prompts, ours.tokens):
        ids = torch.tensor([prompt], device=CUDA)
        ref = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False,
                             eos_token_id=None, pad_token_id=0)
        assert tokens == ref[0, len(prompt):].tolist()


def test_shared_prefix_logprobs_on_cuda_equal_the_plain_forward(tiny_model_dir: Path) -> None:
    model = load_model(tiny_model_dir, dtype=torch.float32, device="cuda")
    g = torch.Generator().manual_seed(0)
    prefix = torch.randint(3, 500, (17,), generator=g).to(CUDA)
    ids = torch.randint(3, 500, (3, 9), generator=g).to(CUDA)
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    target = mask.bool().clone()
    target[:, 0] = False
    with torch.no_grad():
        got = shared_prefix_logprobs(model, prefix, ids, mask, target_mask=target).logprobs
        full = torch.cat([prefix.expand(3, -1), ids], 1)
        full_mask = torch.cat([torch.ones(3, 17, dtype=torch.long, device=CUDA), mask], 1)
        want = token_logprobs(model, full, full_mask, target_mask=torch.cat(
            [torch.zeros(3, 17, dtype=torch.bool, device=CUDA), target], 1)).logprobs[:, 17:]
    torch.testing.assert_close(got, want, rtol=0, atol=1e-4)


def test_bf16_smoke_training_step_on_cuda_has_a_finite_gradient(tmp_path: Path) -> None:
    from memagent import train

    metrics = train.main(["--preset", "smoke", "--output-dir", str(tmp_path / "run"), "--demo.model-dir",
                          str(tmp_path / "model"), "--run.steps", "1", "--model.autocast", "bfloat16",
                          "--rollout.dynamic-sampling", "false"])
    assert torch.isfinite(torch.tensor(metrics["loss/grad_norm"]))


def test_compiled_elementwise_path_on_cuda_equals_eager_logprobs_and_greedy_tokens(tiny_model_dir: Path) -> None:
    """model.compile on a GPU (inductor writes Triton kernels there): float32 log-probs and greedy tokens as eager."""
    from memagent.model.compiled import compile_elementwise

    eager = load_model(tiny_model_dir, dtype=torch.float32, device="cuda")
    compiled = load_model(tiny_model_dir, dtype=torch.float32, device="cuda")
    compile_elementwise(compiled)
    ids = torch.randint(3, 500, (3, 21), generator=torch.Generator().manual_seed(1)).to(CUDA)
    mask = torch.ones_like(ids)
    with torch.no_grad():
        want = token_logprobs(eager, ids, mask).logprobs
        got = token_logprobs(compiled, ids, mask).logprobs
    torch.testing.assert_close(got, want, rtol=0, atol=1e-4)
    prompts = [[5, 9, 11, 40, 7], [3, 8, 14]]
    greedy = SamplingParams(temperature=0.0)
    assert (generate(compiled, prompts, max_new_tokens=8, eos_token_id=None, params=greedy).tokens
            == generate(eager, prompts, max_new_tokens=8, eos_token_id=None, params=greedy).tokens)
