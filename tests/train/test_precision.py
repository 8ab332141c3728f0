"""Mixed precision: fp32 master weights take lr-1e-6 updates under bf16 autocast; bf16 weights do not; the loss
and gradient under autocast agree with fp32 within bf16 tolerance; the loss math sees float32 log-probs."""

from __future__ import annotations

import pytest
import torch

from memagent.model import load_model
from memagent.model.logprobs import token_logprobs
from memagent.model.precision import (
    autocast,
    autocast_dtype,
    cpu_flags_support_bf16,
    storage_dtype,
    training_autocast,
)
from memagent.rl.loss import policy_loss

CPU = torch.device("cpu")
BF16_RTOL = 3e-2
"""bf16 keeps 8 mantissa bits (relative step 2^-8 = 3.9e-3); a few layers of rounding stay well under 3e-2."""


def _batch(vocab: int, rows: int = 3, length: int = 24) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(7)
    ids = torch.randint(5, vocab, (rows, length), generator=gen)
    attention = torch.ones_like(ids)
    attention[0, :6] = 0  # one left-padded row
    response = torch.zeros_like(ids, dtype=torch.bool)
    response[:, length // 2:] = True
    return ids, attention, response


def _loss(model, ids, attention, response, amp: torch.dtype | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The DAPO loss of one on-policy micro-batch (advantages +-1) and the log-probs policy_loss saw."""
    with autocast(CPU, amp):
        logp = token_logprobs(model, ids, attention, target_mask=response).logprobs
    advantages = torch.tensor([1.0, -1.0, 0.5])
    loss, _ = policy_loss(logp, logp.detach(), advantages, response)
    return loss, logp


def _fraction_changed(model, ids, attention, response, amp: torch.dtype | None) -> float:
    """One AdamW update at MemAgent's lr 1e-6; the fraction of weights whose stored value changed."""
    before = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.0)
    loss, _ = _loss(model, ids, attention, response, amp)
    (loss + 0.0 * sum(p.sum() for p in model.parameters())).backward()
    optimizer.step()
    changed = sum(int((p.detach() != b).sum()) for p, b in zip(model.parameters(), before))
    return changed / sum(b.numel() for b in before)


def test_fp32_master_weights_under_bf16_autocast_take_an_lr_1e6_update(tiny_model_dir):
    model = load_model(tiny_model_dir, dtype=torch.float32, device="cpu").train()
    ids, attention, response = _batch(model.config.vocab_size)
    assert _fraction_changed(model, ids, attention, response, torch.bfloat16) > 0.5


def test_bf16_weights_with_adamw_at_lr_1e6_lose_almost_every_update(tiny_model_dir):
    """The design bug 2 replaced: bf16 storage rounds w + 1e-6 * step back to w for nearly every weight."""
    model = load_model(tiny_model_dir, dtype=torch.bfloat16, device="cpu").train()
    ids, attention, response = _batch(model.config.vocab_size)
    assert _fraction_changed(model, ids, attention, response, None) < 0.05


def test_loss_and_gradient_under_autocast_match_fp32_within_bf16_tolerance(tiny_model_dir):
    ids, attention, response = None, None, None
    grads, losses = {}, {}
    for amp in (None, torch.bfloat16):
        model = load_model(tiny_model_dir, dtype=torch.float32, device="cpu").train()
        if ids is None:
            ids, attention, response = _batch(model.config.vocab_size)
        # A non-trivial loss: old log-probs shifted so the ratios differ from 1 and the gradient is not degenerate.
        with autocast(CPU, amp):
            logp = token_logprobs(model, ids, attention, target_mask=response).logprobs
        loss, _ = policy_loss(logp, logp.detach() - 0.05, torch.tensor([1.0, -1.0, 0.5]), response)
        loss.backward()
        losses[amp] = loss.detach()
        grads[amp] = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    assert torch.allclose(losses[torch.bfloat16], losses[None], rtol=BF16_RTOL)
    cosine = torch.nn.functional.cosine_similarity(grads[torch.bfloat16], grads[None], dim=0)
    relative = (grads[torch.bfloat16] - grads[None]).norm() / grads[None].norm()
    assert cosine > 0.99 and relative < 0.1


def test_policy_loss_sees_float32_logprobs_under_autocast(tiny_model):
    ids, attention, response = _batch(tiny_model.config.vocab_size)
    with autocast(CPU, torch.bfloat16):
        hidden_dtype = tiny_model(ids, attention_mask=attention).logits.dtype
    loss, logp = _loss(tiny_model, ids, attention, response, torch.bfloat16)
    assert hidden_dtype == torch.bfloat16  # autocast really ran the matmuls in bf16
    assert logp.dtype == torch.float32 and loss.dtype == torch.float32


def test_bf16_storage_without_deepspeed_is_refused_with_what_to_pass():
    with pytest.raises(ValueError, match="--model.dtype float32"):
        storage_dtype("bfloat16", CPU, deepspeed=False)
    assert storage_dtype("bfloat16", CPU, deepspeed=True) == torch.bfloat16


@pytest.mark.parametrize("deepspeed", [False, True])
def test_auto_storage_keeps_fp32_master_weights_off_deepspeed_gpus(deepspeed):
    assert storage_dtype("auto", CPU, deepspeed=deepspeed) == torch.float32
    assert storage_dtype("float32", torch.device("cuda"), deepspeed=deepspeed) == torch.float32


def test_autocast_mode_explicit_values_override_detection():
    assert autocast_dtype("off", CPU) is None
    assert autocast_dtype("bfloat16", CPU) == torch.bfloat16
    assert training_autocast("bfloat16", CPU, torch.bfloat16) is None  # bf16 weights: no autocast on top
    with pytest.raises(ValueError, match="model.autocast"):
        autocast_dtype("fp16", CPU)


@pytest.mark.parametrize(("flags", "expected"), [
    ({"avx2", "avx512f", "avx512_bf16"}, True), ({"amx_bf16", "amx_tile"}, True), ({"avx2", "avx512f"}, False),
])
def test_cpu_bf16_detection_reads_avx512_bf16_or_amx_flags(flags, expected):
    assert cpu_flags_support_bf16(flags) is expected


def test_every_update_of_a_step_under_autocast_runs_at_the_weights_the_last_update_left(tmp_path, monkeypatch):
    """autocast caches its bf16 copy of each fp32 weight until the outermost autocast context exits; a context
    around a whole RL step would run update 2 on copies made before update 1 changed the weights. Each update's
    loss must equal the same update recomputed from a snapshot of the weights it started from, in a fresh context."""
    import copy

    from memagent import train
    from memagent.rl import rewards, step

    monkeypatch.setitem(rewards.VERIFIERS, "strict", lambda response, golds: float(len(response) % 2))
    calls = []
    original = step.accumulate_gradients

    def recording(model, rows, **kwargs):
        snapshot = copy.deepcopy(model)  # new tensors: nothing of them is in any autocast cache
        metrics = original(model, rows, **kwargs)
        calls.append((snapshot, rows, kwargs, metrics))
        return metrics

    monkeypatch.setattr(step, "accumulate_gradients", recording)
    train.main(["--preset", "smoke", "--output-dir", str(tmp_path / "run"), "--demo.model-dir",
                str(tmp_path / "model"), "--data.num-eval", "0", "--model.autocast", "bfloat16",
                "--optim.mini-batches", "2", "--optim.lr", "1e-2", "--run.steps", "1"])
    assert len(calls) == 2
    for snapshot, rows, kwargs, seen in calls:
        with autocast(CPU, torch.bfloat16):
            fresh = original(snapshot, rows, **{**kwargs, "backward": lambda loss, last: None})
        assert seen["approx_kl"] == pytest.approx(fresh["approx_kl"], rel=1e-6, abs=1e-9)
        assert seen["loss"] == pytest.approx(fresh["loss"], rel=1e-6, abs=1e-9)
    assert calls[1][3]["approx_kl"] != 0.0  # the second update really started from moved weights


def test_warm_start_steps_its_optimizer_outside_autocast(tmp_path, monkeypatch):
    from memagent import train
    from memagent.demo.stage import DemoStage

    enabled = []
    monkeypatch.setattr(DemoStage, "warm_start", lambda *args: enabled.append(torch.is_autocast_enabled("cpu")))
    train.main(["--preset", "smoke", "--output-dir", str(tmp_path / "run"), "--demo.model-dir",
                str(tmp_path / "model"), "--data.num-eval", "0", "--model.autocast", "bfloat16", "--run.steps", "0"])
    assert enabled == [False]


def test_update_policy_refuses_to_run_inside_an_open_autocast_context():
    from memagent.rl.step import update_policy

    stepped = []
    with autocast(CPU, torch.bfloat16), pytest.raises(RuntimeError, match="forward_context"):
        update_policy(torch.nn.Linear(2, 2), [], [], clip_low=0.2, clip_high=0.28, clip_c=10.0, agg="token-mean",
                      norm_len=None, kl_coef=0.0, kl_kind="low_var_kl", world_size=1, budget=64, pad_id=0,
                      temperature=1.0, device=CPU, all_reduce_sum=lambda x: x, backward=lambda loss, last: None,
                      optimizer_step=lambda: stepped.append(1) or (0.0, False))
    assert not stepped
