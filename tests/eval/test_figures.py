"""Reading evaluate.py results and train.py metrics for the report figures (drawing is matplotlib's job)."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest

from memagent.evaluation.figures import read_result_rows, read_training_curve
from memagent.evaluation.tables import aggregate, results_json


def test_result_rows_round_trip_through_results_json(tmp_path) -> None:
    records = [{"method": "memagent", "source": "niah_single_1", "length": 512, "num_chunks": 2, "error": None,
                "metric": "string_match_all", "score": s, "em": None, "f1": None, "wall_s": 1.0}
               for s in (1.0, 0.0, 1.0)]
    rows = aggregate(records)
    path = tmp_path / "results.json"
    path.write_text(json.dumps(results_json(rows, {})))
    assert [asdict(r) for r in read_result_rows(path)] == [asdict(r) for r in rows]
    assert read_result_rows(path)[0].score == pytest.approx(200 / 3)


def test_training_curve_skips_lines_without_the_metric_and_keeps_a_resumed_steps_last_value(tmp_path) -> None:
    lines = [{"step": 0}, {"step": 1, "rollout/accuracy": 0.1}, {"step": 2, "rollout/accuracy": 0.2},
             {"step": 2, "rollout/accuracy": 0.25}, {"step": 3, "rollout/accuracy": 0.4}, {"step": 3, "eval/x": 1}]
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    assert read_training_curve(path) == ([1, 2, 3], [0.1, 0.25, 0.4])


def test_training_curve_names_the_file_and_line_of_a_bad_record(tmp_path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "rollout/accuracy": 0.5}\n{"step": 2, \n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:2: not a JSON line"):
        read_training_curve(path)
