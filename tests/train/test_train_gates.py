"""train.py with gated memory (`--workflow.gates both`, docs/gates.md) end to end on the `smoke` preset.

As in test_train.py, a length-parity stand-in replaces the verifier so that groups have a reward spread. Left free
(`workflow.gate_decoding free`), the random smoke model never writes a decision word, so one run rewrites the text of
the gated updates in turn to KEEP, ANSWER, UPDATE + text and the sampled text: the records keep the sampled ids and
log-probs, so the update trains on KEEP and ANSWER rounds as on any other (the engine's own stop after the word is
tested in tests/rollout/test_stop_rules.py). Another run trains on the model's own decisions, constrained (the
default), where every update parses.
"""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

import pytest

from memagent import train
from memagent.config import load_config
from memagent.config.presets import PRESETS
from memagent.rl import rewards
from memagent.rollout.llm import LocalLLM


@pytest.fixture(autouse=True)
def parity_reward(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(rewards.VERIFIERS, "strict", lambda response, golds: float(len(response) % 2))


class ScriptedDecisions(LocalLLM):
    """The local engine with each gated update's text replaced by the next decision of a cycle."""

    cycle = ("KEEP", "ANSWER", "UPDATE\n{}", "{}")
    calls = 0

    def complete(self, requests, cancelled=None):
        completions = super().complete(requests, cancelled)
        for request, completion in zip(requests, completions):
            if request.stop_texts:  # a gated memory update
                completion.text = self.cycle[ScriptedDecisions.calls % 4].format(completion.text)
                ScriptedDecisions.calls += 1
        return completions


def smoke(out: Path, model_dir: Path, *extra: str) -> list[dict[str, float]]:
    train.main(["--preset", "smoke", "--output-dir", str(out), "--demo.model-dir", str(model_dir),
                "--data.num-eval", "2", "--workflow.gates", "both", *extra])
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_gates_both_trains_end_to_end_with_keep_and_answer_rounds(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(train, "LocalLLM", ScriptedDecisions)
    # Free decoding: the script's last case keeps the sampled text, which then does not parse.
    records = smoke(tmp_path / "run", tmp_path / "model", "--rollout.read-cost", "0.1",
                    "--workflow.gate-decoding", "free")
    steps = [r for r in records if "rollout/reward" in r]
    assert [r["step"] for r in steps] == [1, 2] and all(r["loss/grad_norm"] > 0 for r in steps)
    for r in steps:
        shares = r["gates/keep_share"] + r["gates/update_share"] + r["gates/answer_share"]
        assert shares == pytest.approx(1.0) and r["gates/keep_share"] > 0 and r["gates/answer_share"] > 0
        assert 0 < r["gates/unparsed"] < r["gates/update_share"]
        assert 0 < r["rollout/chunks_read"] and r["rollout/chunks_read_share"] < 1  # ANSWER stopped some early
        assert r["rollout/generated_tokens_per_question"] >= r["rollout/memory_tokens_per_question"]
    trace = (tmp_path / "run" / "traces" / "step_000002.txt").read_text()
    assert "[KEEP]" in trace or "[ANSWER]" in trace


def test_gates_both_trains_with_the_models_own_constrained_decisions_all_parsed(tmp_path) -> None:
    steps = [r for r in smoke(tmp_path / "run", tmp_path / "model") if "rollout/reward" in r]
    assert len(steps) == 2 and all(r["gates/unparsed"] == 0 and r["loss/grad_norm"] > 0 for r in steps)
    for r in steps:
        assert r["gates/keep_share"] + r["gates/update_share"] + r["gates/answer_share"] == pytest.approx(1.0)


def test_a_read_cost_without_the_exit_gate_is_refused() -> None:
    with pytest.raises(ValueError, match="rollout.read_cost=0.1 needs workflow.gates exit or both"):
        load_config(["--preset", "smoke", "--workflow.gates", "update", "--rollout.read-cost", "0.1"])


def test_an_unknown_dynamic_sampling_filter_is_refused_naming_the_choices() -> None:
    with pytest.raises(ValueError, match="rollout.filter_on='score': correct or reward"):
        load_config(["--preset", "smoke", "--rollout.filter-on", "score"])
    assert load_config(["--preset", "smoke", "--rollout.filter-on", "reward"]).rollout.filter_on == "reward"


def test_the_gates_preset_is_the_task_mix_with_both_gates() -> None:
    gated, mix = load_config(["--preset", "smollm2-mix-gates"]), load_config(["--preset", "smollm2-mix"])
    assert gated.workflow.gates == "both" and mix.workflow.gates == "none" and gated.rollout.read_cost == 0.0
    assert {k: v for k, v in PRESETS["smollm2-mix-gates"].items() if k not in ("workflow", "run")} == {
        k: v for k, v in PRESETS["smollm2-mix"].items() if k not in ("workflow", "run")}
    assert PRESETS["smollm2-mix-gates"]["workflow"] == {**PRESETS["smollm2-mix"]["workflow"], "gates": "both"}
    assert gated.run.output_dir != mix.run.output_dir and gated.run.steps == mix.run.steps


def test_the_gated_demo_and_its_twin_differ_only_in_the_gates_and_their_costs() -> None:
    gated, twin = load_config(["--preset", "tiny-gates"]), load_config(["--preset", "tiny-4chunks"])
    assert gated.workflow.gates == "both" and twin.workflow.gates == "none"
    assert gated.rollout.read_cost > 0 and gated.rollout.write_cost > 0 and gated.rollout.filter_on == "reward"
    assert twin.rollout.read_cost == twin.rollout.write_cost == 0.0 and twin.data == gated.data
    assert twin.data.train_chunks == 4 and gated.demo.teacher_decisions[0] > 0 and gated.run.output_dir != twin.run.output_dir
    same = ("model", "loss", "optim", "data", "eval")
    assert all(getattr(gated, name) == getattr(twin, name) for name in same)
    assert {f.name: getattr(gated.demo, f.name) for f in fields(gated.demo) if f.name != "teacher_informed"} == {
        f.name: getattr(twin.demo, f.name) for f in fields(twin.demo) if f.name != "teacher_informed"}


@pytest.mark.parametrize("flag, value, message", [
    ("--rollout.write-cost", "-0.5", "rollout.write_cost=-0.5 must be >= 0"),
    ("--demo.teacher-informed", "1.5", "demo.teacher_informed=1.5 must be in"),
    ("--demo.teacher-decisions", "0.5,0,0.5", "demo.teacher_decisions="),
    ("--demo.teacher-decisions", "0.5,0.5", "demo.teacher_decisions="),
])
def test_bad_gate_cost_and_teacher_settings_are_refused_naming_the_field(flag, value, message) -> None:
    with pytest.raises(ValueError, match=message):
        load_config(["--preset", "tiny-gates", flag, value])
