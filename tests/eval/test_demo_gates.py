"""The gated demo's comparison (memagent.evaluation.demo_gates) on real results.json files written like train.py's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memagent.evaluation import demo_gates


def _run(root: Path, name: str, per_set: dict[str, tuple[float, float, float]], seconds: float | None = None) -> str:
    """A finished run: per held-out set (accuracy, generated tokens per correct, keep share), and the wall time per
    question on every set unless None (a run from before it was recorded)."""
    after = {}
    for s, (acc, tokens, keep) in per_set.items():
        after |= {f"eval/accuracy_{s}": acc, f"eval/generated_tokens_per_correct_{s}": tokens,
                  f"eval/keep_share_{s}": keep, f"eval/update_share_{s}": 1 - keep, f"eval/answer_share_{s}": 0.0,
                  f"eval/chunks_read_share_{s}": 1.0}
        if seconds is not None:
            after[f"perf/eval_seconds_per_question_{s}"] = seconds
    path = root / name
    path.mkdir()
    (path / "results.json").write_text(json.dumps({"before": {}, "after": after}))
    return str(path)


def test_the_target_holds_only_at_half_the_tokens_and_within_two_points(tmp_path: Path) -> None:
    ungated = [_run(tmp_path, f"u{i}", {"1x": (1.0, 24.0, 0.0), "4x": (1.0, 84.0, 0.0), "16x": (0.9, 300.0, 0.0)})
               for i in range(2)]
    gated = [_run(tmp_path, "g0", {"1x": (1.0, 16.0, 0.6), "4x": (0.99, 40.0, 0.8), "16x": (0.85, 100.0, 0.9)}, 0.01),
             _run(tmp_path, "g1", {"1x": (1.0, 14.0, 0.6), "4x": (0.97, 44.0, 0.8), "16x": (0.87, 100.0, 0.9)}, 0.02)]
    rows = {line.split(" | ")[0].strip("| "): line
            for line in demo_gates.main(["--ungated", *ungated, "--gated", *gated]).splitlines()
            if line.startswith("| ") and "x |" in line[:8]}
    assert rows["1x"].endswith("| 1.60x | 60 / 40 / 0 | missed |")  # 24 / 15: too few saved
    assert "| 100 ± 0 | — / 0.015 |" in rows["1x"]  # the ungated runs recorded no wall time; the gated ones' mean
    assert "| 98.0 ± 1.4 |" in rows["4x"] and rows["4x"].endswith("| 2.00x | 80 / 20 / 0 | met |")
    assert rows["16x"].endswith("| 3.00x | 90 / 10 / 0 | missed |")  # 4 points below the ungated 90


def test_unfinished_runs_are_left_out_and_named_and_none_finished_is_an_error(tmp_path: Path, capsys) -> None:
    ungated = _run(tmp_path, "u0", {"1x": (1.0, 24.0, 0.0)})
    gated = _run(tmp_path, "g0", {"1x": (1.0, 12.0, 0.5)})
    (tmp_path / "g1").mkdir()
    (tmp_path / "g0.log").write_text("a run's log, matched by the same glob as the run directories\n")
    table = demo_gates.main(["--ungated", ungated, "--gated", gated, str(tmp_path / "g1"), str(tmp_path / "g0.log"),
                             "--markdown", str(tmp_path / "table.md")])
    assert "Seeds: 1 ungated, 1 gated" in table and (tmp_path / "table.md").read_text() == table + "\n"
    err = capsys.readouterr().err
    assert f"left out (no results.json yet): {tmp_path / 'g1'}" in err and "g0.log" not in err
    with pytest.raises(SystemExit) as stop:
        demo_gates.cli(["--ungated", ungated, "--gated", str(tmp_path / "g1")])
    assert stop.value.code == 2 and "no finished run" in capsys.readouterr().err


def test_a_results_file_without_heldout_accuracy_is_refused_naming_it(tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "results.json").write_text(json.dumps({"before": {}, "after": {}}))
    with pytest.raises(ValueError, match=f"{bad / 'results.json'}: .*no eval/accuracy_"):
        demo_gates.read_results(bad)



def _figure_argv(tmp_path: Path, out: Path) -> list[str]:
    ungated = _run(tmp_path, "u0", {"1x": (1.0, 24.0, 0.0), "4x": (1.0, 84.0, 0.0)})
    gated = _run(tmp_path, "g0", {"1x": (1.0, 15.0, 0.6), "4x": (1.0, 36.0, 0.8)})
    return ["--ungated", ungated, "--gated", gated, "--figure", str(out)]


def test_a_figure_without_matplotlib_is_refused_in_one_line(tmp_path: Path, capsys, monkeypatch) -> None:
    def missing():
        raise RuntimeError("plotting needs matplotlib: pip install matplotlib (or .[plot])")

    monkeypatch.setattr(demo_gates, "pyplot", missing)
    out = tmp_path / "tiny_gates.png"
    with pytest.raises(SystemExit) as stop:
        demo_gates.cli(_figure_argv(tmp_path, out))
    assert stop.value.code == 2 and "error: plotting needs matplotlib" in capsys.readouterr().err
    assert not out.exists()


def test_the_figure_is_a_png_of_both_models_at_every_length(tmp_path: Path, capsys) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "fig" / "tiny_gates.png"
    demo_gates.cli(_figure_argv(tmp_path, out))
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"wrote {out}" in capsys.readouterr().err
