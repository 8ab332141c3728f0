"""Exploring constrained gate decisions (rollout.gate_explore -> SamplingParams.prefix_explore; docs/gates.md).

A constrained step draws from (1 - eps) x the policy renormalized over the trie node's children + eps x uniform over
them; rows outside a trie, greedy rows and eps = 0 are untouched; the recorded log-prob stays the policy's own.
"""

from __future__ import annotations

import math

import pytest
import torch

from memagent import train
from memagent.config import load_config
from memagent.rollout import SamplingParams
from memagent.rollout.constraints import (
    FREE,
    build_automaton,
    explore_logits,
    mask_logits,
    sample_constrained,
)
from memagent.rollout.llm import LocalLLM

CPU = torch.device("cpu")
PREFIXES = ((5, 6), (5, 7, 8), (9,), (11,))  # the root branches three ways (5, 9, 11); node "5" two ways (6, 7)


def mixture_reference(logits: torch.Tensor, allowed: list[int], explore: float, temperature: float) -> torch.Tensor:
    """The exploring distribution of one row, written out in float64: [V]."""
    policy = (logits.double() / temperature).softmax(-1)
    out = torch.zeros_like(policy)
    inside = policy[allowed] / policy[allowed].sum()
    out[allowed] = (1 - explore) * inside + explore / len(allowed)
    return out


@pytest.mark.parametrize("explore, temperature", [(0.5, 0.6), (1.0, 1.0), (0.2, 1.7)])
def test_explored_rows_draw_from_the_policy_mixed_with_a_uniform_over_the_allowed_tokens(explore, temperature) -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 16, generator=g) * 3
    automaton = build_automaton([PREFIXES, PREFIXES, None, PREFIXES], 16, CPU)
    after_five = automaton.edge_child[(automaton.edge_node == 0) & (automaton.edge_token == 5)]
    state = torch.tensor([0, int(after_five), FREE, 0])
    got = (explore_logits(logits, state, automaton, explore, temperature) / temperature).double().softmax(-1)
    for row, allowed in ((0, [5, 9, 11]), (1, [6, 7]), (3, [5, 9, 11])):
        torch.testing.assert_close(got[row], mixture_reference(logits[row], allowed, explore, temperature))
    assert torch.equal(explore_logits(logits, state, automaton, explore, temperature)[2], logits[2])  # FREE row


def test_no_exploration_and_greedy_rows_keep_the_masked_logits() -> None:
    logits = torch.randn(2, 16, generator=torch.Generator().manual_seed(1))
    automaton = build_automaton([PREFIXES, None], 16, CPU)
    masked = mask_logits(logits, automaton.start, automaton)
    assert torch.equal(explore_logits(logits, automaton.start, automaton, 0.0, 0.7), masked)
    assert torch.equal(explore_logits(logits, automaton.start, automaton, 0.5, 0.0), masked)  # greedy: argmax as is


def test_explored_draws_follow_the_mixture_and_record_the_policys_logprob() -> None:
    # One shared distribution per row, a policy that all but rules out two of the three words: eps = 0.6 gives each
    # at least a fifth of the draws. 20000 rows, 5 binomial sigma.
    rows, width, temperature, explore = 20000, 300, 0.6, 0.6
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(width, generator=g)
    logits[5] = 12.0  # the policy's own choice among 5, 9, 11: nearly always 5
    automaton = build_automaton([PREFIXES] * rows, width, CPU)
    params = SamplingParams(temperature=temperature, prefix_explore=explore)
    ids, logprobs, _ = sample_constrained(logits.expand(rows, -1), automaton.start, automaton, params, g)
    expected = mixture_reference(logits, [5, 9, 11], explore, temperature)
    for token in (5, 9, 11):
        share, seen = float(expected[token]), float((ids == token).double().mean())
        assert abs(seen - share) < 5 * math.sqrt(share * (1 - share) / rows), (token, seen, share)
    assert float(expected[9]) > 0.19 and float((logits / temperature).softmax(-1)[9]) < 1e-6
    torch.testing.assert_close(logprobs, (logits / temperature).log_softmax(-1)[ids])  # the policy's, unmixed


def test_rows_outside_a_trie_draw_the_same_tokens_with_or_without_exploration() -> None:
    rows, width = 64, 40
    logits = torch.randn(rows, width, generator=torch.Generator().manual_seed(2))
    automaton = build_automaton([PREFIXES if i % 2 else None for i in range(rows)], width, CPU)

    def draw(explore: float):
        params = SamplingParams(temperature=0.8, prefix_explore=explore)
        return sample_constrained(logits, automaton.start, automaton, params, torch.Generator().manual_seed(3))

    (plain, plain_lp, _), (explored, explored_lp, _) = draw(0.0), draw(0.7)
    free = automaton.start == FREE
    assert torch.equal(plain[free], explored[free]) and torch.equal(plain_lp[free], explored_lp[free])
    assert bool(torch.isin(explored[~free], torch.tensor([5, 9, 11])).all())


@pytest.mark.parametrize("flags, message", [
    (["--workflow.gates", "both", "--rollout.gate-explore", "1.5"], "rollout.gate_explore=1.5 must be in"),
    (["--rollout.gate-explore", "0.5"], "rollout.gate_explore=0.5 explores constrained decisions"),
    (["--workflow.gates", "both", "--workflow.gate-decoding", "free", "--rollout.gate-explore", "0.5"],
     "gate_decoding constrained"),
])
def test_an_exploration_share_out_of_range_or_without_constrained_gates_is_refused(flags, message) -> None:
    with pytest.raises(ValueError, match=message):
        load_config(["--preset", "smoke", *flags])


def test_a_sampler_exploration_share_outside_zero_to_one_is_refused() -> None:
    for share in (-0.1, 1.5):
        with pytest.raises(ValueError, match="prefix_explore must be in"):
            SamplingParams(prefix_explore=share)


class RecordingParams(LocalLLM):
    """The local engine, recording the sampling parameters training rollouts are built with."""

    seen: list[SamplingParams] = []

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        RecordingParams.seen.append(self.params)


def test_training_rollouts_sample_with_the_configured_exploration(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(train, "LocalLLM", RecordingParams)
    RecordingParams.seen = []
    train.main(["--preset", "smoke", "--output-dir", str(tmp_path / "run"), "--demo.model-dir", str(tmp_path / "m"),
                "--data.num-eval", "0", "--run.steps", "1", "--workflow.gates", "both", "--rollout.gate-explore", "0.4"])
    assert RecordingParams.seen and all(p.prefix_explore == 0.4 for p in RecordingParams.seen)
    assert (tmp_path / "run" / "metrics.jsonl").read_text().count('"gates/keep_share"') == 1
