"""The in-training held-out evaluation reports what its answers cost (memagent.training.heldout.heldout_metrics), and
train.py's results table shows it (docs/gates.md, "Metrics")."""

from __future__ import annotations

import pytest

from memagent.records import Sample
from memagent.rl.rewards import answer_score
from memagent.rollout.llm import LocalLLM
from memagent.rollout.prompts import WorkflowConfig
from memagent.rollout.sampling import SamplingParams
from memagent.rollout.workflow import run_memagent
from memagent.train import results_table
from memagent.training.heldout import heldout_metrics

GREEDY = SamplingParams(temperature=0.0)


def _samples(n: int) -> list[Sample]:
    return [Sample(context=f"the code of key {i} is {i * 7}. " * 12, question=f"code of key {i}?", answers=[str(i)])
            for i in range(n)]


@pytest.mark.parametrize("gates", ["none", "both"])
def test_heldout_cost_metrics_equal_a_plain_count_over_the_same_greedy_trajectories(tiny_model, tiny_tokenizer,
                                                                                     gates: str) -> None:
    samples = _samples(6)
    workflow = WorkflowConfig(chunk_tokens=32, memory_tokens=6, answer_tokens=4, question_tokens=32, gates=gates)
    got = heldout_metrics(tiny_model, tiny_tokenizer, samples, workflow, GREEDY, rank=0, world_size=1,
                          all_reduce_sum=lambda t: t, verifier="lenient")
    # The reference: the same greedy run, counted by hand.
    trajs = list(run_memagent(samples, LocalLLM(tiny_model, tiny_tokenizer, params=GREEDY), workflow, group_size=1))
    scores = [answer_score("lenient", t.answer, samples[t.sample_index]) for t in trajs]
    generated = sum(len(c.response_ids) for t in trajs for c in t.conversations)
    read = sum(t.num_chunks for t in trajs)
    whole = sum(t.document_chunks for t in trajs)
    assert got["accuracy"] == pytest.approx(sum(scores) / len(samples))
    assert got["generated_tokens_per_question"] == pytest.approx(generated / len(samples))
    assert got["chunks_read_share"] == pytest.approx(read / whole) and whole > len(samples)
    assert ("generated_tokens_per_correct" in got) == (sum(scores) > 0)
    decisions = [d for t in trajs for d in t.decisions]
    if gates == "none":
        assert "keep_share" not in got and got["chunks_read_share"] == 1.0
    else:
        assert got["keep_share"] == pytest.approx(decisions.count("KEEP") / len(decisions))
        assert got["answer_share"] == pytest.approx(decisions.count("ANSWER") / len(decisions))


def test_the_results_table_shows_accuracy_reading_and_tokens_per_correct_answer() -> None:
    before = {"eval/accuracy_1x": 0.5, "eval/chunks_read_share_1x": 1.0, "eval/generated_tokens_per_correct_1x": 40.0,
              "eval/accuracy_4x": 0.25}
    after = {"eval/accuracy_1x": 1.0, "eval/chunks_read_share_1x": 0.5, "eval/generated_tokens_per_correct_1x": 12.5,
             "eval/accuracy_4x": 0.75}
    lines = results_table(before, after).splitlines()
    assert len(lines) == 4  # header, rule, one row per held-out set: the cost keys are columns, not rows
    assert lines[2] == "| 1x chunks x train | 50.0 | 100.0 | +50.0 | 100 / 50 % | 40.0 / 12.5 |"
    assert lines[3] == "| 4x chunks x train | 25.0 | 75.0 | +50.0 | — / — % | — / — |"
