"""Micro-batch packing: every row once, within the budget, less padding when sorted by length, and exact.

Why any packing is exact: the loss is a sum over tokens divided by a global normalizer counted before the
micro-batch loop (docs/rl-math.md §3), so which rows share a micro-batch changes only the float summation order.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import memagent.rl.step as step
from memagent.config import LossConfig
from memagent.model import build_tiny_model, load_model
from memagent.rl.packing import (
    length_order,
    pack_by_length,
    pack_by_shared_prefix,
    pack_by_token_budget,
    pack_concatenated,
    packed_position_ids,
    padded_fraction,
    padded_size,
    sorted_like,
)
from memagent.rl.step import TrainRow, accumulate_gradients, global_counts, response_logprobs

from .batches import FAST

CPU = torch.device("cpu")
PACKINGS = (pack_by_token_budget, pack_by_length, pack_concatenated)

lengths_st = st.lists(st.integers(1, 60), min_size=0, max_size=40)
budgets_st = st.integers(1, 300)


@FAST
@given(lengths=lengths_st, budget=budgets_st)
def test_every_row_appears_in_exactly_one_group(lengths: list[int], budget: int) -> None:
    for pack in PACKINGS:
        groups = pack(lengths, budget)
        assert sorted(i for g in groups for i in g) == list(range(len(lengths))), pack.__name__
        assert all(groups), pack.__name__


@FAST
@given(lengths=lengths_st, budget=budgets_st)
def test_every_group_fits_the_budget_unless_it_is_one_oversized_row(lengths: list[int], budget: int) -> None:
    for pack in (pack_by_token_budget, pack_by_length):
        for g in pack(lengths, budget):
            assert len(g) == 1 or len(g) * max(lengths[i] for i in g) <= budget, pack.__name__
    for g in pack_concatenated(lengths, budget):
        assert len(g) == 1 or sum(lengths[i] for i in g) <= budget


@FAST
@given(lengths=lengths_st, budget=budgets_st)
def test_sorted_packing_pads_no_more_than_in_order_packing(lengths: list[int], budget: int) -> None:
    in_order = pack_by_token_budget(lengths, budget)
    for cost in (None, 0, 1, budget):
        by_length = pack_by_length(lengths, budget, group_cost=cost)
        assert padded_fraction(lengths, by_length) <= padded_fraction(lengths, in_order) + 1e-12


@FAST
@given(lengths=lengths_st, budget=budgets_st)
def test_sorted_packing_follows_length_order_longest_first(lengths: list[int], budget: int) -> None:
    flat = [i for g in pack_by_length(lengths, budget) for i in g]
    assert flat == length_order(lengths)
    assert all(lengths[a] >= lengths[b] for a, b in zip(flat, flat[1:]))


@FAST
@given(lengths=lengths_st, budget=budgets_st)
def test_sorted_like_keeps_group_sizes_and_never_lengthens_a_groups_longest_row(lengths: list[int], budget: int) -> None:
    groups = pack_by_token_budget(lengths, budget)
    moved = sorted_like(lengths, groups)
    longest = lambda g: max(lengths[i] for i in g)  # noqa: E731
    by_max = sorted(groups, key=lambda g: -longest(g))
    assert [len(g) for g in moved] == [len(g) for g in by_max]
    assert all(longest(new) <= longest(old) for new, old in zip(moved, by_max))
    assert padded_size(lengths, moved) <= padded_size(lengths, groups)


def test_padded_fraction_counts_padding_over_all_positions() -> None:
    lengths = [4, 2, 3, 3]
    assert padded_fraction(lengths, [[0, 1], [2, 3]]) == pytest.approx(2 / 14)
    assert padded_fraction(lengths, [[0], [1], [2, 3]]) == 0.0
    assert padded_fraction([], []) == 0.0 and padded_fraction(lengths, [[0, 1, 2, 3], []]) == pytest.approx(4 / 16)


def test_sorted_packing_removes_the_answer_rows_padding_of_a_memagent_mix() -> None:
    # Two trajectories of 3 memory updates (~100 tokens) and an answer (~30 tokens), in trajectory order.
    lengths = [100, 104, 98, 30, 101, 97, 103, 28]
    in_order, by_length = pack_by_token_budget(lengths, 420), pack_by_length(lengths, 420)
    assert padded_fraction(lengths, in_order) > 0.15
    assert padded_fraction(lengths, by_length) < 0.05


def test_a_micro_batch_is_opened_only_when_it_removes_more_padding_than_its_cost() -> None:
    lengths = [10, 10, 2, 2]  # one group: 40 positions, 16 of them padding; two groups: 24, none
    assert pack_by_length(lengths, 40, group_cost=15) == [[0, 1], [2, 3]]
    assert pack_by_length(lengths, 40, group_cost=17) == [[0, 1, 2, 3]]


def test_packed_position_ids_restart_at_zero_for_every_row() -> None:
    assert packed_position_ids([3, 1, 2], [0, 1, 2]).tolist() == [[0, 1, 2, 0, 0, 1]]
    assert packed_position_ids([3, 1, 2], [2, 0]).tolist() == [[0, 1, 0, 1, 2]]
    assert packed_position_ids([3], []).shape == (1, 0)


# --- exactness on a real (tiny) model, float64 -----------------------------------------------------------------


@pytest.fixture(scope="module")
def model64(tmp_path_factory: pytest.TempPathFactory) -> torch.nn.Module:
    path = build_tiny_model(tmp_path_factory.mktemp("packing_model"), hidden_size=32, num_layers=2,
                            intermediate_size=64)
    return load_model(path, dtype="float32", device="cpu").double().train()


def memagent_rows(seed: int = 0) -> list[TrainRow]:
    """Three trajectories in trajectory order: 2 long memory rows, then 1 short answer row each, a forced token
    in some rows, advantages of both signs."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for t in range(3):
        adv = float(torch.randn(1, generator=g))
        for kind in ("memory", "memory", "answer"):
            p = int(torch.randint(20, 28, (1,), generator=g)) if kind == "memory" else int(torch.randint(6, 9, (1,), generator=g))
            r = int(torch.randint(3, 8, (1,), generator=g))
            mask = [1] * r
            if t == 1:
                mask[-1] = 0
            rows.append(TrainRow(torch.randint(3, 500, (p + r,), generator=g).tolist(), p, mask, advantage=adv))
    return rows


def use_packing(monkeypatch: pytest.MonkeyPatch, pack) -> None:
    """Make memagent.rl.step.micro_batches pack with `pack` (whichever name step.py calls its packer by)."""
    monkeypatch.setattr(step, "pack_by_length", pack, raising=False)
    monkeypatch.setattr(step, "pack_by_token_budget", pack)


def loss_and_gradient(model: torch.nn.Module, rows: list[TrainRow], budget: int) -> tuple[float, torch.Tensor]:
    num_tokens, num_seqs = global_counts(rows, lambda t: t.clone())
    model.zero_grad(set_to_none=True)
    metrics = accumulate_gradients(model, rows, **LossConfig().update_args(), num_tokens=num_tokens,
                                   num_seqs=num_seqs, world_size=1, budget=budget, pad_id=0, temperature=1.0,
                                   device=CPU, backward=lambda loss, is_last: loss.backward())
    grad = torch.cat([p.grad.flatten() for p in model.parameters()])
    model.zero_grad(set_to_none=True)
    return metrics["loss"], grad


@pytest.mark.parametrize("budget", [40, 70, 100, 10_000])
def test_sorted_packing_gives_the_in_order_loss_and_gradient(
    model64: torch.nn.Module, monkeypatch: pytest.MonkeyPatch, budget: int
) -> None:
    rows = memagent_rows()
    g = torch.Generator().manual_seed(1)
    for row in rows:  # old log-probs off the current ones, so ratios differ from 1 and some tokens clip
        row.old_logprobs = -1.0 + 0.3 * torch.randn(len(row.response_mask), generator=g)
    lengths = [len(r.input_ids) for r in rows]
    if budget < 10_000:
        assert pack_by_length(lengths, budget) != pack_by_token_budget(lengths, budget)
    use_packing(monkeypatch, pack_by_token_budget)
    loss_in_order, grad_in_order = loss_and_gradient(model64, rows, budget)
    use_packing(monkeypatch, pack_by_length)
    loss_sorted, grad_sorted = loss_and_gradient(model64, rows, budget)
    assert grad_sorted.dtype == torch.float64 and bool(grad_sorted.abs().sum() > 0)
    assert abs(loss_sorted - loss_in_order) < 1e-6
    torch.testing.assert_close(grad_sorted, grad_in_order, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("budget", [40, 100])
def test_response_logprobs_come_back_in_input_order_whatever_the_packing(
    model64: torch.nn.Module, monkeypatch: pytest.MonkeyPatch, budget: int
) -> None:
    rows = memagent_rows(seed=2)
    alone = [response_logprobs(model64, [r], budget=10_000, pad_id=0, temperature=1.0, device=CPU)[0] for r in rows]
    for pack in (pack_by_token_budget, pack_by_length):
        use_packing(monkeypatch, pack)
        packed = response_logprobs(model64, rows, budget=budget, pad_id=0, temperature=1.0, device=CPU)
        assert [len(lp) for lp in packed] == [len(r.response_mask) for r in rows]
        for got, want in zip(packed, alone):
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


# --- shared prompt prefixes run once per micro-batch ----------------------------------------------------------


def prefixed_prompts(draw_ids: list[int], shape: list[tuple[int, int, int]]) -> tuple[list[list[int]], list[int]]:
    """Prompts from (group, private prompt tokens, response tokens) triples: a template shared by all, a
    per-group block, then private tokens; returns the prompts and the rows' total lengths."""
    template = draw_ids[:12]
    prompts, lengths = [], []
    for k, (group, private, response) in enumerate(shape):
        block = [600 + group] * 10
        prompts.append(template + block + [1000 + 37 * k + i for i in range(private)])
        lengths.append(len(prompts[-1]) + response)
    return prompts, lengths


shape_st = st.lists(st.tuples(st.integers(0, 3), st.integers(1, 6), st.integers(1, 9)), min_size=0, max_size=24)


@FAST
@given(shape=shape_st, budget=st.integers(20, 400), min_prefix=st.integers(1, 30))
def test_shared_prefix_packing_covers_every_row_once_and_each_prefix_is_prompt_common_to_its_rows(
        shape, budget: int, min_prefix: int) -> None:
    prompts, lengths = prefixed_prompts(list(range(3, 40)), shape)
    plan = pack_by_shared_prefix(prompts, lengths, budget, min_prefix)
    assert sorted(i for group, _ in plan for i in group) == list(range(len(lengths)))
    for group, prefix in plan:
        assert group
        if prefix == 0:
            continue
        assert len(group) >= 2 and prefix >= min_prefix
        assert all(prompts[i][:prefix] == prompts[group[0]][:prefix] for i in group)
        assert all(prefix <= len(prompts[i]) - 1 for i in group)  # the first suffix token is prompt, never trained
        assert prefix + len(group) * max(lengths[i] - prefix for i in group) <= budget


def test_shared_prefix_packing_runs_each_groups_common_prompt_once() -> None:
    prompts, lengths = prefixed_prompts(list(range(3, 40)), [(g, 3, 5) for g in (0, 0, 0, 1, 1, 1)])
    plan = pack_by_shared_prefix(prompts, lengths, budget=10_000, min_prefix=8)
    forwarded = sum(prefix + sum(lengths[i] - prefix for i in group) for group, prefix in plan)
    assert sorted(prefix for _, prefix in plan) == [22, 22]  # template + the group's block, per group
    assert forwarded == sum(lengths) - 2 * 2 * 22
    assert pack_by_shared_prefix(prompts, lengths, budget=10_000, min_prefix=0) == [
        (group, 0) for group in pack_by_length(lengths, 10_000)]


def grouped_rows(seed: int = 0) -> list[TrainRow]:
    """MemAgent-like rows: two groups of 3 conversations whose prompts share a template and the group's block,
    then differ (each trajectory's memory); one answer row sharing only the template; a forced token in one."""
    g = torch.Generator().manual_seed(seed)
    template = torch.randint(3, 500, (9,), generator=g).tolist()
    rows = []
    for _ in range(2):
        block = torch.randint(3, 500, (7,), generator=g).tolist()
        adv = float(torch.randn(1, generator=g))
        for k in range(3):
            private = torch.randint(3, 500, (int(torch.randint(1, 5, (1,), generator=g)),), generator=g).tolist()
            response = torch.randint(3, 500, (int(torch.randint(2, 7, (1,), generator=g)),), generator=g).tolist()
            mask = [1] * len(response)
            if k == 1:
                mask[0] = 0
            prompt = template + block + private
            rows.append(TrainRow(prompt + response, len(prompt), mask, advantage=adv * (1 - k)))
    rows.append(TrainRow(template + [7, 8, 9, 10], 11, [1, 1], advantage=0.5))
    return rows


def shared_loss_and_gradient(model: torch.nn.Module, rows: list[TrainRow], budget: int,
                             shared_prefix: int) -> tuple[float, torch.Tensor]:
    num_tokens, num_seqs = global_counts(rows, lambda t: t.clone())
    model.zero_grad(set_to_none=True)
    metrics = accumulate_gradients(model, rows, **LossConfig().update_args(), num_tokens=num_tokens,
                                   num_seqs=num_seqs, world_size=1, budget=budget, pad_id=0, temperature=0.9,
                                   device=CPU, backward=lambda loss, is_last: loss.backward(),
                                   shared_prefix=shared_prefix)
    grad = torch.cat([p.grad.flatten() for p in model.parameters()])
    model.zero_grad(set_to_none=True)
    return metrics["loss"], grad


@pytest.mark.parametrize("budget", [60, 10_000])
def test_shared_prefix_update_gives_the_plain_loss_gradient_and_old_logprobs(model64: torch.nn.Module,
                                                                            budget: int) -> None:
    rows = grouped_rows()
    plan = pack_by_shared_prefix([r.input_ids[: r.prompt_len] for r in rows], [len(r.input_ids) for r in rows],
                                 budget, 8)
    assert any(prefix >= 16 for _, prefix in plan)  # the groups' blocks are shared, not only the template
    plain = response_logprobs(model64, rows, budget=budget, pad_id=0, temperature=0.9, device=CPU)
    shared = response_logprobs(model64, rows, budget=budget, pad_id=0, temperature=0.9, device=CPU, shared_prefix=8)
    for got, want in zip(shared, plain):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    g = torch.Generator().manual_seed(1)
    for row, lp in zip(rows, plain):
        row.old_logprobs = lp + 0.3 * torch.randn(lp.shape, generator=g, dtype=lp.dtype)
    loss_plain, grad_plain = shared_loss_and_gradient(model64, rows, budget, 0)
    loss_shared, grad_shared = shared_loss_and_gradient(model64, rows, budget, 8)
    assert bool(grad_plain.abs().sum() > 0)
    assert abs(loss_shared - loss_plain) < 1e-6
    torch.testing.assert_close(grad_shared, grad_plain, rtol=0, atol=1e-6 * float(grad_plain.abs().max()))
