"""evaluate.py with gated memory (`--gates`, docs/gates.md): the gated workflow runs, traces record its decisions and
costs, results average them; runs recorded before the flag existed still resume, and old traces still aggregate."""

from __future__ import annotations

import json

import pytest

from memagent.evaluation.tables import aggregate, format_cost_table
from memagent.rollout.gates import DECISIONS

from .evaluate_cli import evaluate_argv, read_traces


def test_gates_both_runs_the_gated_workflow_and_records_its_costs(evaluate, tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "run"
    assert evaluate.main(evaluate_argv(tiny_model_dir, out, "--gates", "both", "--baseline", "both", "--window", "512")) == 0
    assert "| read" in capsys.readouterr().out  # the cost table
    assert json.loads((out / "run_config.json").read_text())["gates"] == "both"
    for t in read_traces(out):
        if t["method"] == "full-context":
            assert "chunks_read" not in t
            continue
        assert len(t["decisions"]) == t["chunks_read"] <= t["num_chunks"] and set(t["decisions"]) <= set(DECISIONS)
        assert t["generated_tokens"] >= t["memory_tokens"] >= 0
    rows = {r["method"]: r for r in json.loads((out / "results.json").read_text())["rows"]}
    gated = rows["memagent"]
    assert gated["keep_share"] + gated["update_share"] + gated["answer_share"] == pytest.approx(1.0)
    assert gated["chunks_read"] <= gated["chunks"] and rows["full-context"]["chunks_read"] is None


def test_without_gates_traces_record_costs_but_no_decisions(evaluate, tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    assert evaluate.main(evaluate_argv(tiny_model_dir, out)) == 0
    for t in read_traces(out):
        assert t["decisions"] is None and t["chunks_read"] == t["num_chunks"] and t["generated_tokens"] > 0
    [row] = json.loads((out / "results.json").read_text())["rows"]
    assert row["keep_share"] is None and row["chunks_read"] == row["chunks"]


def test_a_run_recorded_before_the_gate_flags_resumes_as_gates_none(evaluate, tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    evaluate.main(evaluate_argv(tiny_model_dir, out, "--limit", "1"))
    config = json.loads((out / "run_config.json").read_text())
    del config["gates"], config["gate_decoding"]  # as written before the flags existed
    (out / "run_config.json").write_text(json.dumps(config))
    assert evaluate.main(evaluate_argv(tiny_model_dir, out)) == 0
    with pytest.raises(SystemExit, match="gates"):
        evaluate.main(evaluate_argv(tiny_model_dir, out, "--gates", "exit"))
    with pytest.raises(SystemExit, match="gate_decoding"):
        evaluate.main(evaluate_argv(tiny_model_dir, out, "--gate-decoding", "free"))


def test_old_traces_without_cost_fields_aggregate_with_none() -> None:
    old = {"method": "memagent", "source": "kv", "length": 200, "num_chunks": 3, "error": None, "score": 1.0,
           "metric": "string_match_all", "em": None, "f1": None, "wall_s": 0.5}
    [row] = aggregate([old, {**old, "score": 0.0}])
    assert (row.chunks_read, row.generated_tokens, row.generated_tokens_per_correct, row.keep_share) == (
        None, None, None, None)
    assert row.score == 50.0 and format_cost_table([row]) == ""
