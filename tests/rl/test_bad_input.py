"""Bad input raises a ValueError naming the argument; the empty-batch and all-padding rules give a clean 0."""

from __future__ import annotations

import pytest
import torch

from memagent.rl import (
    aggregate,
    broadcast_to_conversations,
    entropy_from_logits,
    group_advantages,
    keep_informative_groups,
    kl_penalty,
    overlong_penalty,
    policy_loss,
)
from memagent.rl.loss import AGG_MODES

from .batches import norm_len_for

B, T = 3, 4


def _inputs():
    logp = torch.randn(B, T, dtype=torch.float64)
    return logp, logp + 0.1, torch.randn(B, dtype=torch.float64), torch.ones(B, T)


@pytest.mark.parametrize(
    ("change", "name"),
    [
        (lambda a: {**a, "old_logp": torch.zeros(B, T + 1)}, "old_logp"),
        (lambda a: {**a, "mask": torch.ones(B + 1, T)}, "mask"),
        (lambda a: {**a, "advantages": torch.zeros(B + 1)}, "advantages"),
        (lambda a: {**a, "advantages": torch.zeros(B, T - 1)}, "advantages"),
        (lambda a: {**a, "logp": torch.zeros(B * T), "old_logp": torch.zeros(B * T), "mask": torch.ones(B * T),
                    "advantages": torch.zeros(B * T)}, "logp"),
        (lambda a: {**a, "agg": "sum"}, "agg"),
        (lambda a: {**a, "clip_c": 1.0}, "clip_c"),
        (lambda a: {**a, "clip_c": 0.5}, "clip_c"),
        (lambda a: {**a, "clip_low": -0.1}, "clip_low"),
        (lambda a: {**a, "num_tokens": 0}, "num_tokens"),
        (lambda a: {**a, "num_tokens": -3.0}, "num_tokens"),
        (lambda a: {**a, "num_seqs": 0, "agg": "seq-mean-token-sum"}, "num_seqs"),
        (lambda a: {**a, "agg": "seq-mean-token-sum-norm"}, "norm_len"),
        (lambda a: {**a, "agg": "seq-mean-token-sum-norm", "norm_len": 0.0}, "norm_len"),
    ],
)
def test_policy_loss_rejects_bad_arguments_by_name(change, name):
    logp, old, adv, mask = _inputs()
    args = change({"logp": logp, "old_logp": old, "advantages": adv, "mask": mask})
    with pytest.raises(ValueError, match=name):
        policy_loss(args.pop("logp"), args.pop("old_logp"), args.pop("advantages"), args.pop("mask"), **args)


@pytest.mark.parametrize("agg", AGG_MODES)
def test_all_padding_without_global_counts_asks_for_them(agg):
    logp, old, adv, _ = _inputs()
    with pytest.raises(ValueError, match="num_tokens/num_seqs"):
        policy_loss(logp, old, adv, torch.zeros(B, T), agg=agg, norm_len=norm_len_for(agg))


@pytest.mark.parametrize("agg", AGG_MODES)
@pytest.mark.parametrize("rows", [0, B])
def test_empty_batch_or_all_padding_with_global_counts_gives_zero_loss_and_gradient(agg, rows):
    logp = torch.randn(rows, T, dtype=torch.float64).requires_grad_(True)
    mask = torch.zeros(rows, T)
    counts = {} if rows == 0 else {"num_tokens": 10, "num_seqs": 4}
    loss, metrics = policy_loss(logp, logp.detach().fill_(float("nan")), torch.full((rows,), float("nan")), mask,
                                agg=agg, norm_len=norm_len_for(agg), **counts)
    assert loss == 0 and loss.requires_grad
    loss.backward()
    assert bool((logp.grad == 0).all())
    assert all(v == 0 for v in metrics.as_dict().values())


def test_aggregate_rejects_mismatched_mask():
    with pytest.raises(ValueError, match="mask"):
        aggregate(torch.zeros(2, 3), torch.ones(2, 4))
    with pytest.raises(ValueError, match="values"):
        aggregate(torch.zeros(6), torch.ones(6))


@pytest.mark.parametrize(
    ("rewards", "ids", "name"),
    [
        (torch.zeros(4), torch.zeros(4), "group_ids"),  # float ids
        (torch.zeros(4), torch.zeros(4, dtype=torch.bool), "group_ids"),
        (torch.zeros(4), torch.zeros(3, dtype=torch.long), "group_ids"),
        (torch.zeros(2, 2), torch.zeros(2, 2, dtype=torch.long), "rewards"),
        (torch.tensor([0.0, float("nan")]), torch.zeros(2, dtype=torch.long), "rewards"),
    ],
)
def test_group_functions_reject_bad_groups(rewards, ids, name):
    with pytest.raises(ValueError, match=name):
        group_advantages(rewards, ids)
    with pytest.raises(ValueError, match=name):
        keep_informative_groups(rewards, ids)


def test_group_advantages_rejects_negative_eps():
    with pytest.raises(ValueError, match="eps"):
        group_advantages(torch.zeros(2), torch.zeros(2, dtype=torch.long), eps=-1.0)


def test_empty_groups_give_empty_results():
    empty = torch.zeros(0)
    ids = torch.zeros(0, dtype=torch.long)
    assert group_advantages(empty, ids).shape == (0,)
    assert keep_informative_groups(empty, ids).shape == (0,)


def test_broadcast_rejects_bad_index():
    values = torch.arange(3.0)
    with pytest.raises(ValueError, match="conv_traj_index"):
        broadcast_to_conversations(values, torch.tensor([0.0, 1.0]))
    with pytest.raises(ValueError, match="conv_traj_index"):
        broadcast_to_conversations(values, torch.tensor([0, 3]))
    with pytest.raises(ValueError, match="conv_traj_index"):
        broadcast_to_conversations(values, torch.tensor([-1]))


def test_kl_penalty_rejects_unknown_kind_and_shape():
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="kind"):
        kl_penalty(x, x, "k4")
    with pytest.raises(ValueError, match="ref_logp"):
        kl_penalty(x, torch.zeros(2, 4))


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"lengths": torch.tensor([3, -1])}, "lengths"),
        ({"max_len": 0}, "max_len"),
        ({"cache_len": 0}, "cache_len"),
        ({"cache_len": 11}, "cache_len"),
        ({"factor": -1.0}, "factor"),
        ({"lengths": torch.zeros(2, 2)}, "lengths"),
    ],
)
def test_overlong_penalty_rejects_bad_arguments(kwargs, name):
    args = {"lengths": torch.tensor([1, 5, 9]), "max_len": 10, "cache_len": 4, "factor": 1.0, **kwargs}
    with pytest.raises(ValueError, match=name):
        overlong_penalty(args.pop("lengths"), **args)


def test_entropy_rejects_scalar_and_integer_logits():
    with pytest.raises(ValueError, match="logits"):
        entropy_from_logits(torch.tensor(1.0))
    with pytest.raises(ValueError, match="logits"):
        entropy_from_logits(torch.ones(2, 3, dtype=torch.long))
