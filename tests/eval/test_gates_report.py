"""The gated-against-ungated report (issue 25): the cell summaries against a hand computation, partial and missing
cells, the target check at its boundaries, the figure and the command line. Every input is a small traces.jsonl."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest

from memagent.evaluation.gates_report import (
    GATED,
    GATED_ROWS,
    UNGATED,
    check_cell,
    cli,
    comparison_table,
    main,
    overall,
    summarise,
)
from memagent.evaluation.mix_scores import SEED_ROWS, MixLayout, read_mix_scores
from memagent.evaluation.mix_targets import Status

TASK = "niah_single_1"
BOTH = MixLayout(seeds=(*SEED_ROWS, *GATED_ROWS))


def write_cell(eval_dir: Path, row: str, length: int, scores: list[float], tokens: float | None = 100.0,
               read: int | None = None, decisions: list[str] | None = None, wall_s: float = 1.0,
               task: str = TASK) -> None:
    """Append one memagent trace record per score to eval_dir/{row}-{length}/traces.jsonl (4 chunks a document)."""
    path = eval_dir / f"{row}-{length}" / "traces.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        for i, score in enumerate(scores):
            f.write(json.dumps({
                "source": task, "length": length, "index": i, "method": "memagent", "task": task, "golds": ["7"],
                "answer": "7", "metric": "string_match_all", "score": score, "em": None, "f1": None,
                "num_chunks": 4, "error": None, "wall_s": wall_s, "chunks_read": 4 if read is None else read,
                "memory_tokens": 10, "generated_tokens": tokens, "decisions": decisions}) + "\n")


def read(eval_dir: Path):
    return read_mix_scores(eval_dir, BOTH)


def row_of(table: str, length_label: str) -> dict[str, str]:
    """The table row of TASK at that length, keyed by header."""
    lines = table.splitlines()
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        if cells[:2] == [TASK, length_label]:
            return dict(zip(header, cells))
    raise AssertionError(f"no row {length_label} in\n{table}")


def test_summaries_match_a_hand_computation(tmp_path) -> None:
    write_cell(tmp_path, "seed0", 8192, [1.0, 1.0], tokens=300.0, wall_s=2.0)
    write_cell(tmp_path, "seed1", 8192, [1.0, 0.0], tokens=200.0, wall_s=4.0)
    write_cell(tmp_path, "gates-seed0", 8192, [1.0, 0.5], tokens=60.0, read=2, decisions=["KEEP", "UPDATE"])
    write_cell(tmp_path, "gates-seed1", 8192, [1.0, 1.0], tokens=90.0, read=3,
               decisions=["KEEP", "KEEP", "UNPARSED", "ANSWER"])
    scores = read(tmp_path)
    u, g = summarise(scores, TASK, 8192, UNGATED), summarise(scores, TASK, 8192, GATED)
    # ungated: accuracy 100 and 50; tokens (300*2 + 200*2) / 3 correct
    assert u.accuracy.mean == pytest.approx(75.0) and u.accuracy.std == pytest.approx(statistics.stdev([100, 50]))
    assert u.tokens_per_correct == pytest.approx(1000 / 3) and u.wall_s == pytest.approx(3.0)
    assert u.keep_share is None and u.chunks_read_share == pytest.approx(1.0)
    # gated: 75 and 100; (60*2 + 90*2) / 3.5 correct; read 2/4 and 3/4; KEEP 1/2 and 2/4, UPDATE 1/2 and 1/4
    assert g.accuracy.mean == pytest.approx(87.5) and g.tokens_per_correct == pytest.approx(300 / 3.5)
    assert g.chunks_read_share == pytest.approx(0.625)
    assert (g.keep_share, g.update_share, g.answer_share) == pytest.approx((0.5, 0.375, 0.125))
    row = row_of(comparison_table(scores, target_n=2), "8192 (16x)")
    assert row["ungated RL"] == f"75.0 ± {statistics.stdev([100, 50]):.1f} (2 seeds)"
    assert row["gated RL"] == f"87.5 ± {statistics.stdev([75, 100]):.1f} (2 seeds)"
    assert row["Δ acc"] == "+12.5"
    assert (row["tok/correct ungated"], row["tok/correct gated"]) == ("333", "86")
    assert row["ratio"] == f"{(1000 / 3) / (300 / 3.5):.2f}x"
    assert (row["chunks read (gated)"], row["KEEP"], row["UPDATE"], row["ANSWER"]) == ("62%", "50%", "38%", "12%")
    assert (row["s/q ungated"], row["s/q gated"]) == ("3.00", "1.00")


def test_partial_cells_show_their_n_and_missing_cells_a_dash(tmp_path) -> None:
    write_cell(tmp_path, "seed0", 512, [1.0])
    table = comparison_table(read(tmp_path), target_n=2)
    row = row_of(table, "512 (1x)")
    assert row["ungated RL"] == "100.0 (1 seed, n≥1)"
    assert row["tok/correct ungated"] == "100"
    for column in ("gated RL", "Δ acc", "tok/correct gated", "ratio", "KEEP", "s/q gated"):
        assert row[column] == "—"
    assert set(row_of(table, "32768 (64x)").values()) - {TASK, "32768 (64x)"} == {"—"}


def test_no_correct_answer_is_infinite_tokens_and_untracked_tokens_are_missing(tmp_path) -> None:
    write_cell(tmp_path, "seed0", 512, [1.0, 1.0])
    write_cell(tmp_path, "gates-seed0", 512, [0.0, 0.0], tokens=5.0)
    write_cell(tmp_path, "seed0", 2048, [1.0, 1.0], tokens=None)
    table = comparison_table(read(tmp_path), target_n=2)
    assert (row_of(table, "512 (1x)")["tok/correct gated"], row_of(table, "512 (1x)")["ratio"]) == ("∞", "0.00x")
    assert math.isinf(summarise(read(tmp_path), TASK, 512, GATED).tokens_per_correct)
    assert row_of(table, "2048 (4x)")["tok/correct ungated"] == "—"


def write_pair(eval_dir: Path, length: int, ungated: float, gated: float, ratio: float) -> None:
    """Three seeds of each model at one accuracy (scores 0-1), the gated ones with `ratio` times fewer tokens per
    correct answer."""
    for u_row, g_row in zip(SEED_ROWS, GATED_ROWS):
        write_cell(eval_dir, u_row.name, length, [ungated, ungated], tokens=100.0 * ungated)
        write_cell(eval_dir, g_row.name, length, [gated, gated], tokens=100.0 * gated / ratio)


def test_target_is_met_at_exactly_twice_fewer_tokens_and_exactly_two_points_down(tmp_path) -> None:
    write_pair(tmp_path, 8192, 0.57, 0.55, 2.0)
    verdict = check_cell(read(tmp_path), TASK, 8192, target_n=2)
    assert verdict.status is Status.MET and not verdict.provisional
    assert "ratio 2.00x, Δ accuracy -2.0 points; 3 ungated, 3 gated seeds" in verdict.detail


def test_target_is_missed_just_below_either_bound(tmp_path) -> None:
    write_pair(tmp_path / "ratio", 8192, 0.57, 0.57, 1.99)
    write_pair(tmp_path / "drop", 8192, 0.57, 0.549, 3.0)
    for case in ("ratio", "drop"):
        assert check_cell(read(tmp_path / case), TASK, 8192, target_n=2).status is Status.MISSED, case


def test_target_waits_for_both_models_and_marks_partial_evidence_provisional(tmp_path) -> None:
    write_cell(tmp_path, "seed0", 32768, [1.0, 1.0])
    verdict = check_cell(read(tmp_path), TASK, 32768, target_n=2)
    assert verdict.status is Status.NOT_MEASURED and verdict.detail == "measured: ungated"
    write_cell(tmp_path, "gates-seed0", 32768, [1.0], tokens=10.0)
    verdict = check_cell(read(tmp_path), TASK, 32768, target_n=2)
    assert verdict.status is Status.MET and verdict.provisional and "1 ungated, 1 gated seeds" in verdict.detail


def test_overall_is_missed_on_any_miss_met_only_when_every_cell_met(tmp_path) -> None:
    waiting = check_cell(read(tmp_path), TASK, 8192, 2)
    assert waiting.status is Status.NOT_MEASURED
    write_pair(tmp_path, 8192, 0.5, 0.5, 2.0)
    met = check_cell(read(tmp_path), TASK, 8192, 2)
    write_pair(tmp_path / "b", 8192, 0.5, 0.5, 1.0)
    missed = check_cell(read(tmp_path / "b"), TASK, 8192, 2)
    assert (met.status, missed.status) == (Status.MET, Status.MISSED)
    assert overall([met, waiting, missed]) is Status.MISSED
    assert overall([met, waiting]) is Status.NOT_MEASURED
    assert overall([met, met]) is Status.MET


def test_cli_writes_the_table_the_cell_verdicts_and_the_overall_one(tmp_path) -> None:
    write_pair(tmp_path / "eval", 8192, 0.5, 0.5, 4.0)
    out = tmp_path / "report" / "gates.md"
    text = main(["--eval-dir", str(tmp_path / "eval"), "--markdown", str(out), "--target-n", "2"])
    assert out.read_text() == text
    assert f"- {TASK} 16x: **met** (ratio 4.00x" in text
    assert f"- {TASK} 64x: **not measured yet** (measured: neither)" in text
    assert "**Overall: not measured yet** over 8 cells." in text  # 4 training tasks x (16x, 64x)
    assert row_of(text.split("\n\n")[1], "8192 (16x)")["ratio"] == "4.00x"


def test_the_report_flags_gated_and_ungated_cells_scored_in_different_dtypes(tmp_path) -> None:
    write_pair(tmp_path / "eval", 8192, 0.5, 0.5, 4.0)
    for row, dtype in (("seed0", "float32"), ("gates-seed0", "bfloat16")):
        (tmp_path / "eval" / f"{row}-8192" / "run_config.json").write_text(json.dumps({"dtype": dtype}))
    text = main(["--eval-dir", str(tmp_path / "eval"), "--target-n", "2"])
    assert "seed 0: float32 (16x)" in text
    assert "more than one dtype (bfloat16, float32)" in text


def test_figure_file_is_written_when_matplotlib_is_present(tmp_path) -> None:
    pytest.importorskip("matplotlib")
    write_pair(tmp_path / "eval", 8192, 0.5, 0.5, 4.0)
    write_cell(tmp_path / "eval", "seed0", 512, [1.0, 1.0])
    main(["--eval-dir", str(tmp_path / "eval"), "--markdown", str(tmp_path / "r.md"),
          "--figure", str(tmp_path / "figs" / "gates.png")])
    assert (tmp_path / "figs" / "gates.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_reports_a_missing_eval_dir_as_one_error_line(tmp_path, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli(["--eval-dir", str(tmp_path / "nowhere")])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.startswith(f"error: --eval-dir {tmp_path / 'nowhere'}: not a directory")


def test_gated_rows_picks_the_read_cost_seeds_and_leaves_the_default_gated_ones_out(tmp_path) -> None:
    for seed in range(3):
        write_cell(tmp_path, f"seed{seed}", 8192, [1.0, 0.0], tokens=400.0)
        write_cell(tmp_path, f"gates-seed{seed}", 8192, [0.0, 0.0], tokens=400.0)
        write_cell(tmp_path, f"gates-cost-seed{seed}", 8192, [1.0, 0.0], tokens=100.0)
    default = main(["--eval-dir", str(tmp_path), "--target-n", "2"])
    cost = main(["--eval-dir", str(tmp_path), "--target-n", "2", "--gated-rows", "gates-cost"])
    assert default.startswith("## Gated against") and cost.startswith("## Gated (gates-cost) against")
    assert row_of(default.split("\n\n")[1], "8192 (16x)")["gated RL"] == "0.0 ± 0.0"
    assert row_of(cost.split("\n\n")[1], "8192 (16x)")["gated RL"] == "50.0 ± 0.0"
    assert f"- {TASK} 16x: **met** (ratio 4.00x, Δ accuracy +0.0 points; 3 ungated, 3 gated seeds)" in cost


def test_a_lora_gated_run_is_compared_with_the_lora_seeds_not_the_full_fine_tuning_ones(tmp_path) -> None:
    eval_dir = tmp_path / "eval"
    write_cell(eval_dir, "seed0", 8192, [1.0, 1.0], tokens=100.0)  # full fine-tuning: not this comparison's
    write_cell(eval_dir, "lora-seed0", 8192, [0.5, 0.5], tokens=400.0)
    write_cell(eval_dir, "lora-gates-cost-seed0", 8192, [0.5, 0.5], tokens=100.0)
    text = main(["--eval-dir", str(eval_dir), "--target-n", "2", "--gated-rows", "lora-gates-cost",
                 "--ungated-preset", "smollm2-mix-lora"])
    assert row_of(text.split("\n\n")[1], "8192 (16x)")["ratio"] == "4.00x"
    assert f"- {TASK} 16x: **met (provisional)** (ratio 4.00x, Δ accuracy +0.0 points; 1 ungated, 1 gated" in text
