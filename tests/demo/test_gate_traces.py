"""Where the gates fire (memagent.demo.gate_traces; docs/gates.md, "The demo"): the per-question letter lines and the
decision-against-needle summary, on hand-built decisions and on a real run directory replayed by the real workflow."""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict
from pathlib import Path

import pytest

from memagent.config import preset_config
from memagent.demo import gate_traces
from memagent.demo.gate_traces import gate_line, gate_positions
from memagent.demo.task import corpus
from memagent.model import build_tiny_model
from memagent.rollout.gates import ANSWER_NOW, KEEP, UNPARSED, UPDATE

K, U, A = KEEP, UPDATE, ANSWER_NOW


def test_a_gate_line_has_one_letter_per_chunk_and_brackets_the_needle() -> None:
    assert gate_line([K, K, U, A], needle_chunk=2, document_chunks=8) == "KK[U]A...."
    assert gate_line([U, UNPARSED], needle_chunk=3, document_chunks=4) == "U?.[.]"  # the needle never read


def test_positions_count_dropped_needles_wasted_writes_and_exits_against_the_needle() -> None:
    decisions = [[K, K, U, A],    # needle 2 written, one chunk after it
                 [K, K, K, K],    # needle 1 kept: evidence dropped, two chunks after it
                 [K, A],          # stopped at chunk 1, needle at 3: never read
                 [U, U, U],       # needle 0 written; two rewrites with nothing new
                 [K, A]]          # answered on the needle's chunk 1 itself: evidence dropped, none after it
    got = gate_positions(decisions, needle_chunks=[2, 1, 3, 0, 1])
    # Needle chunks read: 4 (questions 0, 1, 3, 4), two of them not written. Other chunks read: 3 + 3 + 2 + 2 + 1 =
    # 11, of which UPDATE: question 3's chunks 1 and 2.
    assert got.questions == 5 and got.exits_before_needle == 1
    assert got.needle_dropped == pytest.approx(2 / 4)
    assert got.update_off_needle == pytest.approx(2 / 11)
    assert got.chunks_after_needle == pytest.approx((1 + 2 + 2 + 0) / 4)


def test_mismatched_or_empty_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="2 decision lists for 1 needle chunks"):
        gate_positions([[K], [U]], [0])
    with pytest.raises(ValueError, match="at least one"):
        gate_positions([], [])


@pytest.fixture(scope="module")
def gated_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A gated demo run directory as train.py leaves it: config.json and a checkpoint's model (an untrained tiny
    model, built on the demo corpus so the held-out documents' chunks come out exact)."""
    root = tmp_path_factory.mktemp("run")
    model = build_tiny_model(root / "base", hidden_size=32, num_layers=2, intermediate_size=64, corpus=corpus())
    cfg = preset_config("tiny-gates", demo={"model_dir": str(model)},
                        data={"num_eval": 5, "eval_chunk_factors": (1, 2)}, run={"output_dir": str(root / "run")})
    run = root / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps(asdict(cfg)))
    shutil.copytree(model, run / "checkpoints" / "step_000002" / "model")
    return run


def test_a_run_is_replayed_on_its_own_heldout_set_one_line_per_question(gated_run: Path, capsys) -> None:
    got = gate_traces.main([str(gated_run), "--set", "2x", "--questions", "3"])
    lines = capsys.readouterr().out.splitlines()
    assert got.questions == 5 and len(lines) == 3 + 1  # three questions printed, all five counted
    for line in lines[:3]:
        letters, verdict = line.split("  ")
        assert verdict in ("right", "wrong")
        assert len(letters) == 8 + 2 and letters.count("[") == 1  # 2x of 4 training chunks, the needle bracketed
        assert set(letters) <= set("KUA?.[]")
    assert lines[3].startswith("final, 2x, 5 questions: needle's chunk not written (KEEP or ANSWER there) ")


@pytest.mark.parametrize("argv, message", [
    (["--set", "16x"], "--set 16x: the run held out \\['1x', '2x'\\]"),
    (["--model", "warm_start"], "warm_start: no warm_start model there"),
])
def test_a_bad_set_or_a_missing_model_is_refused_naming_it(gated_run: Path, argv, message) -> None:
    with pytest.raises((ValueError, FileNotFoundError), match=message):
        gate_traces.main([str(gated_run), *argv])


def test_an_ungated_run_is_refused_naming_the_run(tmp_path: Path, capsys) -> None:
    cfg = preset_config("tiny-4chunks")
    (tmp_path / "config.json").write_text(json.dumps(asdict(cfg)))
    with pytest.raises(SystemExit) as stop:
        gate_traces.cli([str(tmp_path)])
    assert stop.value.code == 2 and f"error: {tmp_path}: not a gated demo run" in capsys.readouterr().err
