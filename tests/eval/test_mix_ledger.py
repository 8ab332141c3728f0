"""The ledger of the mix evaluation (issue 24; docs/evaluation.md, "The ledger"): recorded cells fill the table
where no run dir has them, the reading with more questions wins a cell, --update-ledger puts run cells in and keeps
unchanged ones as they were, the report redraws from the ledger alone, a malformed ledger is refused by name, and
the query `make smollm2-mix` asks names the tasks still to score.
Every input is a small traces.jsonl or ledger written here."""

from __future__ import annotations

import dataclasses
import json

import pytest

from memagent.evaluation.mix_ledger import (
    FROM_TRACES,
    RecordedCell,
    read_ledger,
    unfinished_tasks,
    updated_ledger,
    with_ledger,
    write_ledger,
)
from memagent.evaluation.mix_ledger import main as ledger_main
from memagent.evaluation.mix_report import arithmetic_markdown, cli, main, score_table
from memagent.evaluation.mix_scores import read_mix_scores
from memagent.model.loading import weights_fingerprint
from tests.eval.test_mix_report import SMALL, table_cells, write_cell


def recorded(row: str, score: float, n: int, length: int = 512, task: str = "niah_single_1",
             dtype: str = "float32", weights: str = "w1") -> RecordedCell:
    return RecordedCell(row=row, task=task, length=length, n=n, score=score, metric="string_match_all",
                        chunks=length / 256, dtype=dtype, weights=weights, recorded="2026-12-01", origin="a table")


def test_write_then_read_gives_back_the_same_cells(tmp_path) -> None:
    cells = [recorded("seed1", 62.5, 48), recorded("untrained", 12.5, 8, length=32768, dtype="unrecorded")]
    path = tmp_path / "sub" / "ledger.json"
    write_ledger(path, cells)
    assert sorted(read_ledger(path), key=lambda c: c.row) == sorted(cells, key=lambda c: c.row)
    assert not list(path.parent.glob("*.tmp"))


def test_an_absent_ledger_is_empty_and_a_malformed_one_is_refused_by_file_and_cell(tmp_path) -> None:
    assert read_ledger(tmp_path / "none.json") == []
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    with pytest.raises(ValueError, match="bad.json: not a ledger"):
        read_ledger(bad)
    cell = json.loads(json.dumps(recorded("seed0", 50.0, 48).__dict__))
    del cell["dtype"]
    bad.write_text(json.dumps({"cells": [recorded("seed0", 50.0, 48).__dict__, cell]}))
    with pytest.raises(ValueError, match=r"bad.json: cell 1: expected the fields"):
        read_ledger(bad)


def test_recorded_cells_fill_the_table_where_no_run_has_them(tmp_path) -> None:
    write_cell(tmp_path, "untrained", "niah_single_1", 512, [1.0, 0.0])
    ledger = [recorded("seed0", 100.0, 2), recorded("seed1", 50.0, 2), recorded("seed7", 0.0, 2)]
    scores = with_ledger(read_mix_scores(tmp_path, SMALL), ledger, SMALL)
    table = score_table(scores, SMALL.train_tasks, SMALL.train_lengths, SMALL)
    # untrained from the run, seeds 0 and 1 from the ledger; seed7 is no row of the layout
    assert table_cells(table, "niah_single_1", "512 (1x)")[:5] == ["50.0", "—", "100.0", "50.0", "—"]
    assert ("seed7", "niah_single_1", 512) not in scores.cells
    assert scores.dtypes[("seed0", 512)] == "float32"


def test_a_row_mixing_a_retrained_seed_with_recorded_cells_of_one_length_is_flagged(tmp_path) -> None:
    # seed 0 trained again: its run dir at 1x holds one task so far, the ledger the other task of the old weights
    write_cell(tmp_path, "seed0", "niah_single_1", 512, [1.0, 1.0])
    (tmp_path / "seed0-512" / "run_config.json").write_text(json.dumps({"dtype": "float32", "weights": "w2"}))
    ledger = [recorded("seed0", 50.0, 2, task="vt", weights="w1")]
    scores = with_ledger(read_mix_scores(tmp_path, SMALL), ledger, SMALL)
    assert scores.weights[("seed0", "vt", 512)] == "w1"
    assert scores.weights[("seed0", "niah_single_1", 512)] == "w2"
    assert "seed 0's cells come from more than one set of weights (w1, w2)" in arithmetic_markdown(scores, SMALL)


def test_the_reading_with_more_questions_wins_a_cell_and_the_run_wins_a_tie(tmp_path) -> None:
    write_cell(tmp_path, "seed0", "niah_single_1", 512, [1.0])  # a restarted cell, 1 question so far
    write_cell(tmp_path, "seed1", "niah_single_1", 512, [1.0, 1.0])
    ledger = [recorded("seed0", 25.0, 2), recorded("seed1", 0.0, 2)]
    scores = with_ledger(read_mix_scores(tmp_path, SMALL), ledger, SMALL)
    assert (scores.cells[("seed0", "niah_single_1", 512)].score, scores.cells[("seed0", "niah_single_1", 512)].n) \
        == (25.0, 2)
    assert scores.cells[("seed1", "niah_single_1", 512)].score == 100.0


def test_update_puts_in_run_cells_with_as_many_questions_and_keeps_unchanged_entries(tmp_path) -> None:
    write_cell(tmp_path, "seed0", "niah_single_1", 512, [1.0])
    write_cell(tmp_path, "seed1", "niah_single_1", 512, [1.0, 0.0])
    write_cell(tmp_path, "seed2", "niah_single_1", 512, [0.0, 0.0])
    (tmp_path / "seed2-512" / "run_config.json").write_text(json.dumps({"dtype": "float32", "weights": "w9"}))
    write_cell(tmp_path, "untrained", "niah_single_1", 32768, [0.5])
    ledger = [recorded("seed0", 25.0, 2), recorded("seed1", 50.0, 2), recorded("seed2", 100.0, 2)]
    out = {(c.row, c.length): c for c in updated_ledger(ledger, read_mix_scores(tmp_path, SMALL), "2026-12-07")}
    assert out[("seed0", 512)] == ledger[0]  # fewer questions in the run: the ledger keeps its reading
    assert out[("seed1", 512)] == ledger[1]  # the same reading: entry and date unchanged
    assert (out[("seed2", 512)].score, out[("seed2", 512)].weights, out[("seed2", 512)].recorded,
            out[("seed2", 512)].origin) == (0.0, "w9", "2026-12-07", FROM_TRACES)
    new = out[("untrained", 32768)]
    assert (new.n, new.score, new.chunks, new.dtype, new.weights) == (1, 50.0, 128.0, "unrecorded", "unrecorded")


def test_cli_redraws_from_the_ledger_alone_and_updates_it_from_runs(tmp_path, capsys) -> None:
    ledger = tmp_path / "ledger.json"
    write_ledger(ledger, [recorded("seed1", 75.0, 2)])
    text = main(["--eval-dir", str(tmp_path / "no-runs-yet"), "--ledger", str(ledger), "--target-n", "2"])
    assert "| 75.0 " in text
    runs = tmp_path / "eval"
    write_cell(runs, "seed2", "niah_single_1", 512, [1.0, 1.0])
    main(["--eval-dir", str(runs), "--ledger", str(ledger), "--update-ledger", "--target-n", "2"])
    assert {(c.row, c.score) for c in read_ledger(ledger)} == {("seed1", 75.0), ("seed2", 100.0)}
    with pytest.raises(SystemExit):
        cli(["--eval-dir", str(runs), "--update-ledger"])
    assert "--update-ledger needs --ledger" in capsys.readouterr().err


def test_without_a_ledger_a_missing_eval_dir_is_still_an_error(tmp_path) -> None:
    with pytest.raises(ValueError, match="not a directory"):
        main(["--eval-dir", str(tmp_path / "none")])


def test_unfinished_tasks_are_those_missing_partial_or_scored_in_another_dtype() -> None:
    ledger = [recorded("seed0", 50.0, 48, task="niah_single_1"), recorded("seed0", 50.0, 47, task="vt"),
              recorded("seed0", 50.0, 48, task="fwe", dtype="bfloat16"),
              recorded("seed0", 50.0, 48, task="kv_retrieval", dtype="unrecorded"),
              recorded("seed1", 50.0, 48, task="niah_multiquery"),
              recorded("seed0", 50.0, 48, task="niah_multiquery", length=2048)]
    tasks = ["niah_multiquery", "niah_single_1", "vt", "fwe", "kv_retrieval"]
    assert unfinished_tasks(ledger, "seed0", 512, tasks, 48, "float32", "w1") == ["niah_multiquery", "vt", "fwe"]
    assert unfinished_tasks(ledger, "seed0", 512, tasks, 47, "bfloat16", "w1") == [
        "niah_multiquery", "niah_single_1", "vt"]
    # the same seed trained again (other weights), or a reading whose weights went unrecorded: nothing is finished
    assert unfinished_tasks(ledger, "seed0", 512, tasks, 48, "float32", "w2") == tasks
    unrecorded = [dataclasses.replace(c, weights="unrecorded") for c in ledger]
    assert unfinished_tasks(unrecorded, "seed0", 512, tasks, 48, "float32", "unrecorded") == tasks


def test_the_query_prints_the_unfinished_tasks_and_refuses_a_bad_dtype(tmp_path, tiny_model_dir, capsys) -> None:
    ledger = tmp_path / "ledger.json"
    write_ledger(ledger, [recorded("seed0", 50.0, 48, task="vt", weights=weights_fingerprint(tiny_model_dir))])
    query = ["--ledger", str(ledger), "--row", "seed0", "--length", "512", "--device", "cpu",
             "--model", str(tiny_model_dir)]
    ledger_main([*query, "--dtype", "float32", "--tasks", "vt", "fwe"])
    assert capsys.readouterr().out == "fwe\n"
    ledger_main([*query, "--dtype", "float32", "--tasks", "vt"])
    assert capsys.readouterr().out == "\n"
    with pytest.raises(SystemExit):
        ledger_main([*query, "--dtype", "float8", "--tasks", "vt"])
    assert "float8" in capsys.readouterr().err


def test_the_query_counts_a_reading_of_base_plus_adapter_only_for_that_adapter(tmp_path, tiny_model_dir, capsys) -> None:
    adapter = tmp_path / "adapter.safetensors"
    adapter.write_bytes(b"stands in for the adapter's bytes")
    ledger = tmp_path / "ledger.json"
    write_ledger(ledger, [recorded("lora-seed0", 50.0, 48, task="vt",
                                   weights=weights_fingerprint(tiny_model_dir, adapter))])
    query = ["--ledger", str(ledger), "--row", "lora-seed0", "--length", "512", "--device", "cpu", "--dtype",
             "float32", "--model", str(tiny_model_dir), "--tasks", "vt"]
    ledger_main([*query, "--adapter", str(adapter)])
    assert capsys.readouterr().out == "\n"
    ledger_main(query)  # the base alone is other weights
    assert capsys.readouterr().out == "vt\n"
