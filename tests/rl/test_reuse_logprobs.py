"""rollout.reuse_logprobs: the sampler's log-probs stand in for step 5's recomputed old log-probs.

They are the same quantity (log pi_old of each sampled token at the rollout temperature) computed under another
batch shape (a KV-cache decode instead of one packed forward), so they must agree to float32 rounding; and the
option must refuse sampling rules under which they are not the old policy's. Constrained gate decisions
(workflow.gate_decoding, docs/gates.md) are drawn from the policy restricted to the decision words, yet the sampler
records the policy's own log-probs for them, so reuse stays exact and stays on.
"""

from __future__ import annotations

import pytest
import torch

from memagent.config import load_config
from memagent.records import Reward, Sample
from memagent.rl.rows import trajectories_to_rows
from memagent.rl.step import response_logprobs
from memagent.rollout.gates import ANSWER_NOW, KEEP, UNPARSED
from memagent.rollout.llm import LocalLLM
from memagent.rollout.prompts import WorkflowConfig
from memagent.rollout.sampling import SamplingParams
from memagent.rollout.workflow import run_memagent

DOCUMENT = "The capital of France is Paris. The key is under the blue stone. Document 12 has a library.\n" * 3


def _rollout(model, tokenizer, temperature: float, **workflow):
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(4.0)  # sharper logits: varied samples, and log-probs far from uniform
    llm = LocalLLM(model, tokenizer, params=SamplingParams(temperature=temperature),
                   generator=torch.Generator().manual_seed(0))
    config = WorkflowConfig(chunk_tokens=32, memory_tokens=12, answer_tokens=8, max_chunks=None, question_tokens=64,
                            **workflow)
    trajectories = run_memagent([Sample(DOCUMENT, "Where is the key?", ["stone"])] * 2, llm, config, group_size=3)
    for i, t in enumerate(trajectories):
        t.reward = Reward(correct=float(i % 2), overlong=0.0)
    return trajectories


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_reused_logprobs_equal_recomputed_old_logprobs_to_float32_rounding(tiny_model, tiny_tokenizer,
                                                                           temperature: float) -> None:
    trajectories = _rollout(tiny_model, tiny_tokenizer, temperature)
    reused = trajectories_to_rows(trajectories, scale_by_std=True, eps=1e-6, reuse_logprobs=True)
    recomputed = response_logprobs(tiny_model, reused, budget=4096, pad_id=tiny_tokenizer.pad_token_id,
                                   temperature=temperature, device=torch.device("cpu"))
    assert sum(len(r.response_mask) for r in reused) > 50
    for row, lp in zip(reused, recomputed):
        assert row.old_logprobs.dtype == torch.float32 and row.old_logprobs.shape == lp.shape
        torch.testing.assert_close(row.old_logprobs, lp, atol=2e-5, rtol=0)
    spread = torch.cat([r.old_logprobs for r in reused])
    assert float(spread.min()) < -0.5  # not a degenerate near-greedy rollout, where any log-prob would be ~0


def test_reused_logprobs_equal_recomputed_ones_for_constrained_gate_decisions(tiny_model, tiny_tokenizer) -> None:
    trajectories = _rollout(tiny_model, tiny_tokenizer, 1.0, gates="both", gate_decoding="constrained")
    decisions = [d for t in trajectories for d in t.decisions]
    assert len(set(decisions)) > 1 and UNPARSED not in decisions  # every update opened with an offered word
    reused = trajectories_to_rows(trajectories, scale_by_std=True, eps=1e-6, reuse_logprobs=True)
    recomputed = response_logprobs(tiny_model, reused, budget=4096, pad_id=tiny_tokenizer.pad_token_id,
                                   temperature=1.0, device=torch.device("cpu"))
    for row, lp in zip(reused, recomputed):
        torch.testing.assert_close(row.old_logprobs, lp, atol=2e-5, rtol=0)
    # The decision tokens were drawn under the mask, where the word's later letters are forced (log-prob 0 there);
    # the reused values are the policy's, below 0.
    word_rows = [(c, r) for c, r in zip((c for t in trajectories for c in t.conversations), reused)
                   if c.decision in (KEEP, ANSWER_NOW)]
    assert word_rows and all(float(r.old_logprobs[1:].max()) < -1e-3 for _, r in word_rows)


def test_auto_reuse_stays_on_under_constrained_gate_decisions() -> None:
    cfg = load_config(["--preset", "smoke", "--workflow.gates", "both"])
    assert cfg.workflow.gate_decoding == "constrained" and cfg.rollout.reuses_logprobs(None)


def test_rows_without_reuse_leave_old_logprobs_for_step_5(tiny_model, tiny_tokenizer) -> None:
    rows = trajectories_to_rows(_rollout(tiny_model, tiny_tokenizer, 1.0), scale_by_std=True, eps=1e-6)
    assert all(r.old_logprobs is None for r in rows)


def test_reuse_refuses_a_conversation_without_sampler_logprobs(tiny_model, tiny_tokenizer) -> None:
    trajectories = _rollout(tiny_model, tiny_tokenizer, 1.0)
    trajectories[0].conversations[0].logprobs = torch.zeros(0)
    with pytest.raises(ValueError, match="reuse_logprobs"):
        trajectories_to_rows(trajectories, scale_by_std=True, eps=1e-6, reuse_logprobs=True)


@pytest.mark.parametrize("flag", [["--rollout.top-p", "0.9"], ["--rollout.top-k", "50"],
                                  ["--rollout.temperature", "0"]])
def test_reuse_is_refused_for_sampling_rules_whose_logprobs_are_not_the_policys(flag: list[str]) -> None:
    with pytest.raises(ValueError, match="rollout.reuse_logprobs"):
        load_config(["--preset", "smoke", "--rollout.reuse-logprobs", "on", *flag])


@pytest.mark.parametrize(("mode", "autocast", "flags", "reuses"), [
    ("auto", None, [], True),  # fp32: a decode step and a packed forward agree to float32 rounding
    ("auto", torch.bfloat16, [], False),  # bf16 rounding differs between the two: recompute
    ("auto", None, ["--rollout.top-p", "0.9"], False),  # the sampler's distribution is not the scored one
    ("on", torch.bfloat16, [], True),
    ("off", None, [], False),
])
def test_auto_reuses_logprobs_only_where_they_equal_a_recomputation(mode, autocast, flags, reuses) -> None:
    cfg = load_config(["--preset", "smoke", "--rollout.reuse-logprobs", mode, *flags])
    assert cfg.rollout.reuses_logprobs(autocast) is reuses


def test_an_unknown_reuse_mode_is_named() -> None:
    with pytest.raises(ValueError, match="auto, on or off"):
        load_config(["--preset", "smoke", "--rollout.reuse-logprobs", "yes"])
