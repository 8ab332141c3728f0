"""The report of MemAgent's evaluation in small (issue 24): reading `{row}-{length}/traces.jsonl` cells, the
tables' partial and missing cells, the seed mean and spread, each target's verdict at its boundary, the training
curves, the figure and the command line. Every input is a small traces.jsonl or metrics.jsonl written here."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from memagent.evaluation.mix_report import (
    arithmetic_markdown,
    cli,
    curves_markdown,
    main,
    read_curves,
    score_table,
    targets_markdown,
)
from memagent.evaluation.mix_scores import MixLayout, read_mix_scores, read_traces, seed_spread
from memagent.evaluation.mix_targets import (
    Status,
    check_beyond_window,
    check_gain_over_untrained,
    check_heldout_gain,
    check_length_retention,
)

SMALL = MixLayout(train_tasks=("niah_single_1",), heldout_tasks=("vt",), train_lengths=(512, 32768),
                  heldout_lengths=(512,), target_n=2)
"""One training task at 1x and 64x (beyond the 8192-token window), one held-out task at 1x, 2 questions a cell."""


def write_cell(eval_dir: Path, row: str, task: str, length: int, scores: list[float],
               method: str = "memagent") -> None:
    """Append one trace record per score (0-1) to eval_dir/{row}-{length}/traces.jsonl, as evaluate.py does."""
    path = eval_dir / f"{row}-{length}" / "traces.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    start = len(path.read_text().splitlines()) if path.exists() else 0
    with path.open("a") as f:
        for i, score in enumerate(scores, start):
            f.write(json.dumps({
                "source": task, "length": length, "index": i, "method": method, "task": task, "golds": ["7"],
                "memories": ["m"], "answer": "7", "extracted": "7", "metric": "string_match_all", "score": score,
                "em": None, "f1": None, "num_chunks": length // 256, "error": None, "wall_s": 1.0}) + "\n")


def split_row(line: str) -> list[str]:
    """The cells of one markdown table line."""
    return [c.strip() for c in line.strip().strip("|").split("|")]


def table_cells(table: str, *labels: str) -> list[str]:
    """The cells of the first table row that starts with the cells `labels`, without them."""
    for line in table.splitlines():
        cells = split_row(line)
        if cells[: len(labels)] == list(labels):
            return cells[len(labels):]
    raise AssertionError(f"no row {labels!r} in\n{table}")


def table_column(table: str, header: str) -> list[str]:
    """The cells under `header`, top to bottom (the last one is the average row's), in a table and nothing else."""
    header_line, _, *body = table.splitlines()
    column = split_row(header_line).index(header)
    return [split_row(line)[column] for line in body]


# Reading and the tables --------------------------------------------------------------------------------------------

def test_partial_cell_shows_its_n_and_missing_cell_shows_a_dash(tmp_path) -> None:
    write_cell(tmp_path, "untrained", "niah_single_1", 512, [1.0, 0.0])
    write_cell(tmp_path, "untrained", "niah_single_1", 32768, [0.5])
    table = score_table(read_mix_scores(tmp_path, SMALL), SMALL.train_tasks, SMALL.train_lengths, SMALL)
    assert split_row(table.splitlines()[0]) == ["task", "tokens (x train)", "untrained", "full-context", "seed 0",
                                                 "seed 1", "seed 2", "RL mean ± std", "RL − untrained"]
    assert table_column(table, "task") == ["niah_single_1", "niah_single_1", "average"]
    assert table_column(table, "tokens (x train)") == ["512 (1x)", "32768 (64x)", ""]
    assert table_column(table, "untrained") == ["50.0", "50.0 (n=1)", "50.0 (n≥1)"]
    for column in ("full-context", "seed 0", "RL mean ± std", "RL − untrained"):
        assert table_column(table, column) == ["—", "—", "—"]


def test_rl_mean_sample_std_gain_and_averages_match_a_hand_computation(tmp_path) -> None:
    for seed, scores in (("seed0", [0.5, 0.5]), ("seed1", [1.0, 0.5]), ("seed2", [1.0, 1.0])):
        write_cell(tmp_path, seed, "niah_single_1", 512, scores)
    write_cell(tmp_path, "seed0", "niah_single_1", 32768, [0.2, 0.4])
    write_cell(tmp_path, "seed2", "niah_single_1", 32768, [0.8, 0.6])
    write_cell(tmp_path, "untrained", "niah_single_1", 512, [0.5, 0.0])
    scores = read_mix_scores(tmp_path, SMALL)
    # 50, 75, 100 -> mean 75, sample std sqrt((25^2 + 0 + 25^2) / 2) = 25
    assert seed_spread(scores, "niah_single_1", 512, SMALL).mean == pytest.approx(75.0)
    assert seed_spread(scores, "niah_single_1", 512, SMALL).std == pytest.approx(25.0)
    table = score_table(scores, SMALL.train_tasks, SMALL.train_lengths, SMALL)
    # 64x: seeds 0 and 2 only, 30 and 70 -> 50 ± sqrt(2) * 20; average: seed0 (50 + 30) / 2, seed2 (100 + 70) / 2
    seed_averages = [40.0, 85.0]
    assert table_column(table, "RL mean ± std") == [
        "75.0 ± 25.0", f"50.0 ± {2 ** 0.5 * 20:.1f} (2 seeds)",
        f"{statistics.fmean(seed_averages):.1f} ± {statistics.stdev(seed_averages):.1f} (2 seeds)"]
    assert table_column(table, "seed 1") == ["75.0", "—", "—"]
    # RL − untrained: 75 - 25 at 1x; 64x has no untrained score, so neither it nor the average has a gain
    assert table_column(table, "RL − untrained") == ["+50.0", "—", "—"]
    write_cell(tmp_path, "untrained", "niah_single_1", 32768, [0.6, 0.6])  # 50 - 60 at 64x
    table = score_table(read_mix_scores(tmp_path, SMALL), SMALL.train_tasks, SMALL.train_lengths, SMALL)
    assert table_column(table, "RL − untrained") == ["+50.0", "-10.0", f"{statistics.fmean([50.0, -10.0]):+.1f}"]
    # averages: untrained (25 + 60) / 2, seeds 0 and 2 as above, seed 1 lacks 64x
    assert table_cells(table, "average") == [
        "", "42.5", "—", "40.0", "—", "85.0",
        f"{statistics.fmean(seed_averages):.1f} ± {statistics.stdev(seed_averages):.1f} (2 seeds)", "+20.0"]


def test_a_single_seed_shows_its_value_without_spread(tmp_path) -> None:
    write_cell(tmp_path, "seed1", "niah_single_1", 512, [0.5, 1.0])
    scores = read_mix_scores(tmp_path, SMALL)
    assert seed_spread(scores, "niah_single_1", 512, SMALL).std is None
    table = score_table(scores, SMALL.train_tasks, SMALL.train_lengths, SMALL)
    assert table_cells(table, "niah_single_1", "512 (1x)") == ["—", "—", "—", "75.0", "—", "75.0 (1 seed)", "—"]


def test_only_the_rows_own_method_counts_and_foreign_dirs_are_ignored(tmp_path) -> None:
    write_cell(tmp_path, "baseline", "niah_single_1", 512, [1.0, 1.0], method="full-context")
    write_cell(tmp_path, "baseline", "niah_single_1", 512, [0.0, 0.0], method="memagent")
    write_cell(tmp_path, "seed7", "niah_single_1", 512, [1.0, 1.0])
    (tmp_path / "untrained.log").write_text("progress\n")
    scores = read_mix_scores(tmp_path, SMALL)
    assert [(key, row.score, row.n) for key, row in scores.cells.items()] == [
        (("baseline", "niah_single_1", 512), 100.0, 2)]


def test_a_cut_off_last_line_is_skipped_and_the_file_left_as_it_is(tmp_path) -> None:
    write_cell(tmp_path, "untrained", "niah_single_1", 512, [1.0, 0.0])
    path = tmp_path / "untrained-512" / "traces.jsonl"
    with path.open("a") as f:
        f.write('{"source": "niah_single_1", "len')  # a run still writing its next record
    before = path.read_bytes()
    assert len(read_traces(path)) == 2
    assert read_mix_scores(tmp_path, SMALL).cells[("untrained", "niah_single_1", 512)].n == 2
    assert path.read_bytes() == before


def test_a_broken_line_inside_the_file_names_the_file_and_line(tmp_path) -> None:
    path = tmp_path / "traces.jsonl"
    path.write_text('{"a": 1}\nnot json\n{"a": 2}\n')
    with pytest.raises(ValueError, match=r"traces.jsonl:2: not a JSON trace record"):
        read_traces(path)


def test_each_cell_reports_the_dtype_its_run_recorded_and_a_mix_of_dtypes_is_flagged(tmp_path) -> None:
    for row, length, dtype in [("untrained", 512, "float32"), ("seed0", 512, "bfloat16"), ("seed0", 32768, None)]:
        write_cell(tmp_path, row, "niah_single_1", length, [1.0, 0.0])
        recorded = {"model": row} if dtype is None else {"model": row, "dtype": dtype}
        (tmp_path / f"{row}-{length}" / "run_config.json").write_text(json.dumps(recorded))
    scores = read_mix_scores(tmp_path, SMALL)
    assert scores.dtypes == {("untrained", 512): "float32", ("seed0", 512): "bfloat16",
                             ("seed0", 32768): "unrecorded"}
    text = arithmetic_markdown(scores, SMALL)
    assert "untrained: float32 (1x)" in text
    assert "seed 0: bfloat16 (1x), unrecorded (64x)" in text
    assert "more than one dtype (bfloat16, float32)" in text


def test_a_row_whose_cells_come_from_other_weights_is_flagged(tmp_path) -> None:
    for row, length, weights in [("untrained", 512, "aa"), ("untrained", 32768, "aa"), ("seed0", 512, None),
                                 ("seed0", 32768, "bb")]:
        write_cell(tmp_path, row, "niah_single_1", length, [1.0])
        recorded = {"dtype": "float32"} | ({} if weights is None else {"weights": weights})
        (tmp_path / f"{row}-{length}" / "run_config.json").write_text(json.dumps(recorded))
    scores = read_mix_scores(tmp_path, SMALL)
    assert scores.weights[("seed0", "niah_single_1", 512)] == "unrecorded"
    text = arithmetic_markdown(scores, SMALL)
    assert "seed 0's cells come from more than one set of weights (bb, unrecorded)" in text
    assert "untrained's cells" not in text


def test_cells_in_one_dtype_are_not_flagged(tmp_path) -> None:
    for row in ("untrained", "seed0"):
        write_cell(tmp_path, row, "niah_single_1", 512, [1.0])
        (tmp_path / f"{row}-512" / "run_config.json").write_text(json.dumps({"dtype": "float32"}))
    assert "more than one dtype" not in arithmetic_markdown(read_mix_scores(tmp_path, SMALL), SMALL)


# Target checks -----------------------------------------------------------------------------------------------------

def test_gain_over_untrained_is_met_at_exactly_ten_points_and_missed_below(tmp_path) -> None:
    for length in (512, 32768):
        write_cell(tmp_path, "untrained", "niah_single_1", length, [0.09, 0.09])
    # seeds 0, 57, 0: a mean of 19, +10 exactly, which floating point puts 4e-15 below the bar
    for seed, score in (("seed0", 0.0), ("seed1", 0.57), ("seed2", 0.0)):
        write_cell(tmp_path, seed, "niah_single_1", 512, [score, score])
    assert check_gain_over_untrained(read_mix_scores(tmp_path, SMALL), SMALL).status is Status.NOT_MEASURED
    write_cell(tmp_path, "seed0", "niah_single_1", 32768, [0.19, 0.18])  # 18.5: +9.5
    check = check_gain_over_untrained(read_mix_scores(tmp_path, SMALL), SMALL)
    assert check.status is Status.MISSED and "niah_single_1 64x (18.5 vs untrained 9.0: +9.5)" in check.detail
    assert check.missing_seeds and not check.partial_cells  # 64x has seed 0 only, with every question
    (tmp_path / "seed0-32768" / "traces.jsonl").unlink()
    write_cell(tmp_path, "seed0", "niah_single_1", 32768, [0.19, 0.19])
    assert check_gain_over_untrained(read_mix_scores(tmp_path, SMALL), SMALL).status is Status.MET


def test_a_failing_cell_misses_the_target_while_other_cells_are_still_unmeasured(tmp_path) -> None:
    write_cell(tmp_path, "untrained", "niah_single_1", 512, [0.5, 0.5])
    write_cell(tmp_path, "seed0", "niah_single_1", 512, [0.5])
    check = check_gain_over_untrained(read_mix_scores(tmp_path, SMALL), SMALL)
    assert check.status is Status.MISSED and check.partial_cells
    assert "1 of 2 cells not measured yet" in check.detail


def test_length_retention_is_met_at_exactly_eighty_percent_of_1x(tmp_path) -> None:
    write_cell(tmp_path, "seed0", "niah_single_1", 512, [0.55, 0.55])
    write_cell(tmp_path, "seed0", "niah_single_1", 32768, [0.44, 0.44])  # 80% of 55, a hair below in floats
    assert check_length_retention(read_mix_scores(tmp_path, SMALL), SMALL).status is Status.MET
    write_cell(tmp_path, "seed1", "niah_single_1", 512, [0.55, 0.55])
    write_cell(tmp_path, "seed1", "niah_single_1", 32768, [0.42, 0.42])  # mean 43 < 44
    assert check_length_retention(read_mix_scores(tmp_path, SMALL), SMALL).status is Status.MISSED


def test_length_retention_waits_for_both_lengths(tmp_path) -> None:
    write_cell(tmp_path, "seed0", "niah_single_1", 512, [0.8, 0.8])
    check = check_length_retention(read_mix_scores(tmp_path, SMALL), SMALL)
    assert check.status is Status.NOT_MEASURED and "1 of 1 tasks not measured yet" in check.detail


def test_beyond_window_needs_strictly_more_than_the_baseline(tmp_path) -> None:
    write_cell(tmp_path, "seed0", "niah_single_1", 32768, [0.5, 0.5])
    assert check_beyond_window(read_mix_scores(tmp_path, SMALL), SMALL).status is Status.NOT_MEASURED
    write_cell(tmp_path, "baseline", "niah_single_1", 32768, [0.5, 0.5], method="full-context")
    assert check_beyond_window(read_mix_scores(tmp_path, SMALL), SMALL).status is Status.MISSED
    write_cell(tmp_path, "seed1", "niah_single_1", 32768, [0.5, 0.6])  # mean over seeds 52.5 > 50
    check = check_beyond_window(read_mix_scores(tmp_path, SMALL), SMALL)
    assert check.status is Status.MET and "52.5 vs baseline 50.0" in check.detail


def test_beyond_window_ignores_lengths_inside_the_window(tmp_path) -> None:
    write_cell(tmp_path, "seed0", "niah_single_1", 512, [0.0, 0.0])
    write_cell(tmp_path, "baseline", "niah_single_1", 512, [1.0, 1.0], method="full-context")
    write_cell(tmp_path, "seed0", "niah_single_1", 32768, [1.0, 1.0])
    write_cell(tmp_path, "baseline", "niah_single_1", 32768, [0.0, 0.0], method="full-context")
    assert check_beyond_window(read_mix_scores(tmp_path, SMALL), SMALL).status is Status.MET


def test_a_verdict_on_every_seed_and_question_is_final_and_one_without_is_marked_provisional(tmp_path) -> None:
    write_cell(tmp_path, "baseline", "niah_single_1", 32768, [0.0, 0.0], method="full-context")
    for seed in ("seed0", "seed1"):
        write_cell(tmp_path, seed, "niah_single_1", 32768, [0.5, 0.5])
    write_cell(tmp_path, "seed2", "niah_single_1", 32768, [0.5])
    line = targets_markdown([check_beyond_window(read_mix_scores(tmp_path, SMALL), SMALL)]).splitlines()[-1]
    assert line.startswith("- **(c) met (provisional: partial cells)**: above the truncated full-context baseline")
    write_cell(tmp_path, "seed2", "niah_single_1", 32768, [0.5])
    line = targets_markdown([check_beyond_window(read_mix_scores(tmp_path, SMALL), SMALL)]).splitlines()[-1]
    assert line.startswith("- **(c) met**: ")
    (tmp_path / "seed2-32768" / "traces.jsonl").unlink()
    check = check_beyond_window(read_mix_scores(tmp_path, SMALL), SMALL)
    assert check.status is Status.MET and check.missing_seeds and "(provisional: not every seed)" in \
        targets_markdown([check])


def test_heldout_gain_is_an_average_met_at_exactly_five_points(tmp_path) -> None:
    two_cells = MixLayout(train_tasks=(), heldout_tasks=("vt", "fwe"), heldout_lengths=(512,), target_n=2)
    write_cell(tmp_path, "untrained", "vt", 512, [0.5, 0.5])
    write_cell(tmp_path, "untrained", "fwe", 512, [0.2, 0.2])
    write_cell(tmp_path, "seed0", "vt", 512, [0.7, 0.7])  # +20
    check = check_heldout_gain(read_mix_scores(tmp_path, two_cells), two_cells)
    assert check.status is Status.NOT_MEASURED and "1 of 2 cells not measured yet" in check.detail
    write_cell(tmp_path, "seed0", "fwe", 512, [0.1, 0.1])  # -10: the mean gain is +5
    assert check_heldout_gain(read_mix_scores(tmp_path, two_cells), two_cells).status is Status.MET
    write_cell(tmp_path, "seed1", "fwe", 512, [0.0, 0.0])  # fwe over seeds 5: -15, mean gain +2.5
    write_cell(tmp_path, "seed1", "vt", 512, [0.7])
    check = check_heldout_gain(read_mix_scores(tmp_path, two_cells), two_cells)
    assert check.status is Status.MISSED and check.partial_cells and "mean gain +2.5 over 2 of 2" in check.detail


# Training curves, figure, command line -----------------------------------------------------------------------------

def write_metrics(run_dir: Path) -> None:
    lines = [{"step": 0}, {"step": 1, "rollout/accuracy": 0.25, "rollout/accuracy/niah_single_1": 0.5,
                           "rollout/memory_len": 60.0, "rollout/answer_len": 30.5},
             {"step": 2, "rollout/accuracy": 0.5, "rollout/memory_len": 40.0, "rollout/answer_len": 12.0}]
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))


def test_training_curve_table_has_a_row_per_step_in_percent_and_tokens(tmp_path) -> None:
    write_metrics(tmp_path / "run")
    text = curves_markdown(read_curves(tmp_path / "run", ("niah_single_1", "vt")))
    header = next(line for line in text.splitlines() if line.startswith("| step"))
    assert split_row(header) == ["step", "accuracy %", "niah_single_1 %", "memory tokens", "answer tokens"]
    assert table_cells(text, "1") == ["25.0", "50.0", "60.0", "30.5"]
    assert table_cells(text, "2") == ["50.0", "—", "40.0", "12.0"]
    assert "Sampled training rollouts (the training verifier)" in text  # no config.json: no temperature claimed
    (tmp_path / "run" / "config.json").write_text(json.dumps({"rollout": {"temperature": 0.6}}))
    assert "at temperature 0.6 (" in curves_markdown(read_curves(tmp_path / "run", ("niah_single_1",)))


def test_a_run_without_metrics_is_an_error_naming_it(tmp_path) -> None:
    with pytest.raises(ValueError, match=r"--runs .*empty: no metrics.jsonl"):
        read_curves(tmp_path / "empty")


def test_figure_file_is_written_when_matplotlib_is_present(tmp_path) -> None:
    pytest.importorskip("matplotlib")
    from memagent.evaluation.mix_figure import draw_mix_figure

    write_cell(tmp_path, "untrained", "niah_single_1", 512, [1.0, 0.0])
    write_cell(tmp_path, "seed0", "niah_single_1", 512, [1.0, 1.0])
    write_cell(tmp_path, "seed1", "niah_single_1", 512, [1.0, 0.5])
    write_cell(tmp_path, "baseline", "vt", 512, [1.0, 0.0], method="full-context")
    path = draw_mix_figure(read_mix_scores(tmp_path, SMALL), tmp_path / "figs" / "mix.png", SMALL)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_writes_tables_targets_and_curves_and_skips_a_run_that_is_no_directory(tmp_path, capsys) -> None:
    write_cell(tmp_path / "eval", "untrained", "niah_single_1", 512, [1.0, 0.0])
    write_metrics(tmp_path / "smollm2-mix-seed0")
    (tmp_path / "smollm2-mix-seed0.log").write_text("log\n")
    out = tmp_path / "report" / "mix.md"
    main(["--eval-dir", str(tmp_path / "eval"), "--runs", str(tmp_path / "smollm2-mix-seed0"),
          str(tmp_path / "smollm2-mix-seed0.log"), "--markdown", str(out), "--target-n", "2"])
    text = out.read_text()
    for heading in ("### Training tasks", "### Held-out tasks", "### Target check", "### Training curve"):
        assert heading in text
    assert table_cells(text, "niah_single_1", "512 (1x)")[0] == "50.0"
    verdicts = [line.split("**")[1] for line in text.splitlines() if line.startswith("- **(")]
    assert verdicts == [f"{name} not measured yet" for name in ("(a)", "(b)", "(c)", "(d)")]
    assert "skipping --runs" in capsys.readouterr().err


def test_where_the_golds_went_covers_memagent_rows_of_training_tasks_only(tmp_path) -> None:
    from memagent.evaluation.mix_report import read_fates, report_markdown

    write_cell(tmp_path, "untrained", "niah_single_1", 512, [1.0, 0.0])  # answer "7" holds gold "7": answered
    write_cell(tmp_path, "seed0", "niah_single_1", 32768, [1.0])
    write_cell(tmp_path, "untrained", "vt", 512, [1.0])  # held out: not a training task
    write_cell(tmp_path, "baseline", "niah_single_1", 512, [1.0], method="full-context")  # no memory to read
    fates = read_fates(tmp_path, SMALL)
    assert [(c.row, c.task, c.total, c.counts["answered"]) for c in fates] == [
        ("untrained, 1x", "niah_single_1", 2, 2), ("seed 0, 64x", "niah_single_1", 1, 1)]
    text = report_markdown(read_mix_scores(tmp_path, SMALL), [], SMALL, fates)
    assert table_cells(text, "niah_single_1", "seed 0, 64x")[:2] == ["1", "100.0"]


def test_hedged_answers_cover_every_row_with_its_own_method_and_reach_the_report(tmp_path) -> None:
    from memagent.evaluation.mix_report import read_hedging, report_markdown

    write_cell(tmp_path, "seed0", "niah_single_1", 512, [1.0, 0.0])  # answer "7", gold "7": nothing else named
    write_cell(tmp_path, "baseline", "niah_single_1", 512, [1.0], method="full-context")
    write_cell(tmp_path, "untrained", "vt", 512, [1.0])  # a held-out task, gold "7" here: it has a shape
    hedging = read_hedging(tmp_path, SMALL)
    assert [(c.row, c.task, c.n, c.score, c.hedged) for c in hedging] == [
        ("untrained, 1x", "vt", 1, 100.0, 0.0), ("full-context, 1x", "niah_single_1", 1, 100.0, 0.0),
        ("seed 0, 1x", "niah_single_1", 2, 50.0, 0.0)]
    text = report_markdown(read_mix_scores(tmp_path, SMALL), [], SMALL, hedging=hedging)
    assert table_cells(text, "niah_single_1", "seed 0, 1x")[:3] == ["2", "50.0", "0.0"]


def test_cli_reports_a_missing_eval_dir_as_one_error_line(tmp_path, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli(["--eval-dir", str(tmp_path / "nowhere")])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.startswith(f"error: --eval-dir {tmp_path / 'nowhere'}: not a directory")


def test_the_lora_grid_reports_its_own_seed_rows_and_not_the_full_fine_tuning_ones(tmp_path) -> None:
    eval_dir = tmp_path / "eval"
    write_cell(eval_dir, "untrained", "niah_single_1", 512, [0.0, 0.0])
    write_cell(eval_dir, "seed0", "niah_single_1", 512, [1.0, 1.0])
    write_cell(eval_dir, "lora-seed0", "niah_single_1", 512, [1.0, 0.0])
    argv = ["--eval-dir", str(eval_dir), "--target-n", "2"]
    lora, full = main([*argv, "--preset", "smollm2-mix-lora"]), main(argv)
    assert "smollm2-mix-lora" in lora.splitlines()[0] and "LoRA seed 0" in lora
    assert "smollm2-mix-lora" not in full and "LoRA seed 0" not in full
    first_seed = 2  # after the untrained and full-context columns
    assert table_cells(lora, "niah_single_1", "512 (1x)")[first_seed] == "50.0"
    assert table_cells(full, "niah_single_1", "512 (1x)")[first_seed] == "100.0"
