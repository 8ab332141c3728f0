"""Resumable trace files: a killed run's cut-off line is dropped, nothing is written twice."""

from __future__ import annotations

import json

import pytest

from memagent.evaluation.traces import TraceFile


def _record(index: int, method: str = "memagent") -> dict:
    return {"source": "kv", "length": 512, "index": index, "method": method, "answer": f"a{index}"}


def test_reopened_trace_file_knows_every_finished_sample(tmp_path):
    traces = TraceFile(tmp_path / "t.jsonl")
    for i in range(3):
        traces.append(_record(i))
    traces.append(_record(0, "full-context"))
    again = TraceFile(tmp_path / "t.jsonl")
    assert set(again.done) == {("kv", 512, 0, "memagent"), ("kv", 512, 1, "memagent"), ("kv", 512, 2, "memagent"),
                               ("kv", 512, 0, "full-context")}
    assert not again.dropped_partial_line


def test_cut_off_last_line_is_dropped_and_the_file_repaired(tmp_path):
    path = tmp_path / "t.jsonl"
    traces = TraceFile(path)
    traces.append(_record(0))
    traces.append(_record(1))
    path.write_bytes(path.read_bytes()[:-7])  # a kill in the middle of writing line 2
    repaired = TraceFile(path)
    assert repaired.dropped_partial_line and set(repaired.done) == {("kv", 512, 0, "memagent")}
    repaired.append(_record(1))
    lines = path.read_text().splitlines()
    assert [json.loads(line)["index"] for line in lines] == [0, 1]


def test_appending_a_finished_sample_again_is_refused(tmp_path):
    traces = TraceFile(tmp_path / "t.jsonl")
    traces.append(_record(0))
    with pytest.raises(ValueError, match="already"):
        traces.append(_record(0))


def test_corrupt_line_in_the_middle_raises_naming_the_line(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(_record(0)) + "\nnot json\n" + json.dumps(_record(1)) + "\n")
    with pytest.raises(ValueError, match=r"t.jsonl:2"):
        TraceFile(path)
