"""The optimizer step's normalization: the gradient of one update does not depend on how rows are split.

Micro-batch token budgets and (simulated, in-process) data-parallel ranks only change how the sum is computed:
the global normalizer is counted before the micro-batch loop and each rank's loss is scaled by the world size, so
averaging the ranks' gradients (what DDP / DeepSpeed do) gives the single-process gradient (docs/rl-math.md §3).
"""

from __future__ import annotations

import pytest
import torch

from memagent.config import LossConfig
from memagent.model import build_tiny_model, load_model
from memagent.rl.step import (
    TrainRow,
    accumulate_gradients,
    collate,
    global_counts,
    micro_batches,
    pack_by_token_budget,
    response_logprobs,
    set_logprobs,
    update_policy,
)

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> torch.nn.Module:
    path = build_tiny_model(tmp_path_factory.mktemp("step_model"), hidden_size=32, num_layers=2, intermediate_size=64)
    return load_model(path, dtype="float32", device="cpu").train()


def make_rows(n: int = 7, seed: int = 0) -> list[TrainRow]:
    """Rows of varied prompt / response lengths, a forced (mask 0) token in some, advantages of both signs."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for i in range(n):
        p, r = int(torch.randint(3, 12, (1,), generator=g)), int(torch.randint(2, 9, (1,), generator=g))
        ids = torch.randint(3, 500, (p + r,), generator=g).tolist()
        mask = [1] * r
        if i % 3 == 0:
            mask[0] = 0
        rows.append(TrainRow(ids, p, mask, advantage=float(torch.randn(1, generator=g))))
    return rows


def with_old_logprobs(model: torch.nn.Module, rows: list[TrainRow]) -> list[TrainRow]:
    """Old log-probs = current ones + noise, so ratios differ from 1 and some tokens clip."""
    g = torch.Generator().manual_seed(1)
    for row, lp in zip(rows, response_logprobs(model, rows, budget=10_000, pad_id=0, temperature=1.0, device=CPU)):
        row.old_logprobs = lp + 0.3 * torch.randn(lp.shape, generator=g)
    return rows


def gradient(model: torch.nn.Module, parts: list[list[TrainRow]], budget: int, agg: str) -> tuple[float, torch.Tensor]:
    """Loss and flat gradient averaged over simulated ranks (one part per rank), as DDP would average them."""
    world = len(parts)
    total = torch.tensor([0.0, 0.0], dtype=torch.float64)
    for part in parts:
        total += torch.tensor(global_counts(part, lambda t: t.clone()), dtype=torch.float64)  # all_reduce SUM
    num_tokens, num_seqs = float(total[0]), float(total[1])
    grads, loss = [], 0.0
    for part in parts:
        model.zero_grad(set_to_none=True)
        metrics = accumulate_gradients(
            model, part, **LossConfig(agg=agg, norm_len=16.0).update_args(), num_tokens=num_tokens, num_seqs=num_seqs,
            world_size=world, budget=budget, pad_id=0, temperature=1.0, device=CPU,
            backward=lambda loss, is_last: loss.backward())
        loss += metrics["loss"] / world
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    model.zero_grad(set_to_none=True)
    return loss, torch.stack(grads).mean(0)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_loss_and_gradient_invariant_to_micro_batch_token_budget(model: torch.nn.Module, agg: str) -> None:
    rows = with_old_logprobs(model, make_rows())
    loss_one, grad_one = gradient(model, [rows], budget=100_000, agg=agg)  # one micro-batch
    loss_many, grad_many = gradient(model, [rows], budget=20, agg=agg)  # about one row per micro-batch
    assert len(pack_by_token_budget([len(r.input_ids) for r in rows], 20)) >= len(rows) - 1
    assert abs(loss_one - loss_many) < 1e-6
    torch.testing.assert_close(grad_many, grad_one, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-sum"])
def test_two_simulated_ranks_give_the_single_process_loss_and_gradient(model: torch.nn.Module, agg: str) -> None:
    rows = with_old_logprobs(model, make_rows(n=9, seed=3))
    loss_one, grad_one = gradient(model, [rows], budget=64, agg=agg)
    loss_two, grad_two = gradient(model, [rows[:2], rows[2:]], budget=64, agg=agg)  # uneven split on purpose
    assert abs(loss_one - loss_two) < 1e-6
    torch.testing.assert_close(grad_two, grad_one, rtol=1e-5, atol=1e-7)


def test_empty_micro_batches_contribute_nothing(model: torch.nn.Module) -> None:
    rows = with_old_logprobs(model, make_rows(n=4, seed=5))
    loss_plain, grad_plain = gradient(model, [rows], budget=64, agg="token-mean")
    counts = global_counts(rows, lambda t: t.clone())
    model.zero_grad(set_to_none=True)
    metrics = accumulate_gradients(model, rows, **LossConfig().update_args(), num_tokens=counts[0], num_seqs=counts[1], world_size=1,
                                   budget=64, pad_id=0, temperature=1.0, device=CPU, num_micro=12,
                                   backward=lambda loss, is_last: loss.backward())
    grad_padded = torch.cat([p.grad.flatten() for p in model.parameters()])
    assert abs(metrics["loss"] - loss_plain) < 1e-6
    torch.testing.assert_close(grad_padded, grad_plain, rtol=1e-5, atol=1e-7)


def test_pack_by_token_budget_keeps_order_and_respects_the_budget() -> None:
    lengths = [5, 9, 3, 30, 2, 2, 8]
    groups = pack_by_token_budget(lengths, budget=20)
    assert [i for g in groups for i in g] == list(range(len(lengths)))
    for g in groups:
        assert len(g) == 1 or len(g) * max(lengths[i] for i in g) <= 20


def first_update(model: torch.nn.Module, rows: list[TrainRow]) -> tuple[dict[str, float], torch.Tensor]:
    """One update's metrics and flat gradient over `rows` as one mini-batch, budget 40 (several micro-batches)."""
    model.zero_grad(set_to_none=True)
    num_tokens, num_seqs = global_counts(rows, lambda t: t.clone())
    metrics = accumulate_gradients(
        model, rows, **LossConfig().update_args(), num_tokens=num_tokens, num_seqs=num_seqs, world_size=1,
        budget=40, pad_id=0, temperature=0.8, device=CPU, backward=lambda loss, is_last: loss.backward())
    grad = torch.cat([p.grad.flatten() for p in model.parameters()])
    model.zero_grad(set_to_none=True)
    return metrics, grad


def test_a_first_mini_batch_without_old_logprobs_is_its_own_old_policy_as_a_recomputation_would_be(
        model: torch.nn.Module) -> None:
    recomputed, own = make_rows(seed=3), make_rows(seed=3)
    set_logprobs(model, [recomputed], [len(micro_batches(recomputed, 40))], "old_logprobs", budget=40, pad_id=0,
                 temperature=0.8, device=CPU)
    assert all(r.old_logprobs is not None for r in recomputed) and all(r.old_logprobs is None for r in own)
    want_metrics, want = first_update(model, recomputed)
    got_metrics, got = first_update(model, own)
    assert got_metrics["clipfrac"] == want_metrics["clipfrac"] == 0.0 and got_metrics["approx_kl"] == 0.0
    assert got_metrics["loss"] == pytest.approx(want_metrics["loss"], rel=1e-6, abs=1e-9)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-9)


def test_only_the_first_mini_batch_may_go_without_old_logprobs(model: torch.nn.Module) -> None:
    minis = [make_rows(4, seed=5), make_rows(4, seed=6)]
    with pytest.raises(ValueError, match="mini-batch 1 has rows without old log-probs"):
        update_policy(model, minis, [1, 1], **LossConfig().update_args(), world_size=1, budget=10_000, pad_id=0,
                      temperature=1.0, device=CPU, all_reduce_sum=lambda t: t.clone(),
                      backward=lambda loss, is_last: loss.backward(), optimizer_step=lambda: (0.0, False))
    half = make_rows(2, seed=7)
    half[0].old_logprobs = torch.zeros(len(half[0].response_mask))
    with pytest.raises(ValueError, match="some rows of the micro-batch have old log-probs and some do not"):
        collate(half, pad_id=0, device=CPU)
