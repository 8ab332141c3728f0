"""Every command line answers a user error with one `error: ...` line and exit status 2, never a traceback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from memagent.cli import run_cli

REPO = Path(__file__).resolve().parents[1]


def run(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k != "MEMAGENT_DEBUG"} | (env or {})
    return subprocess.run([sys.executable, *args], cwd=REPO, env=environ, capture_output=True, text=True, timeout=120)


def error_line(proc: subprocess.CompletedProcess) -> str:
    """The one `error:` line of stderr; fails on a traceback or on more than one error line."""
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, proc.stderr
    return lines[0]


@pytest.fixture
def bad_data(tmp_path: Path) -> Path:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps([{"context": 3, "question": "q", "answers": ["a"]}]))
    return path


@pytest.mark.slow  # a fresh interpreter importing torch
def test_evaluate_bad_data_file_names_file_item_and_field(tiny_model_dir, bad_data):
    line = error_line(run(["evaluate.py", "--model", str(tiny_model_dir), "--data", str(bad_data),
                           "--output-dir", str(bad_data.parent / "eval")]))
    assert str(bad_data) in line and "item 0" in line and "'context'" in line


@pytest.mark.slow  # a fresh interpreter importing torch
def test_debug_flag_shows_the_traceback(tmp_path):
    proc = run(["-m", "memagent.ask", "--debug", "--model", str(tmp_path), "--document", str(tmp_path / "none.txt"),
                "--question", "q"])
    assert proc.returncode == 2
    assert "Traceback" in proc.stderr and "error: --document" in proc.stderr


def test_debug_variable_shows_the_traceback_of_a_user_error(monkeypatch, capsys):
    def bad_value(argv: list[str]) -> int:
        raise ValueError("bad field")

    monkeypatch.setenv("MEMAGENT_DEBUG", "1")
    with pytest.raises(SystemExit) as stop:
        run_cli(bad_value, [])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and err.endswith("error: bad field\n")


@pytest.mark.slow  # a fresh interpreter importing torch
def test_train_config_file_syntax_error_names_file_and_line(tmp_path):
    broken = tmp_path / "broken.json"
    broken.write_text('{"loss": {\n  "clip_high": 0.2,\n}}')
    line = error_line(run(["train.py", "--config", str(broken)]))
    assert str(broken) in line and "line 3" in line


def test_train_config_file_value_error_names_file_and_field(tmp_path):
    from memagent.config import load_config

    typed = tmp_path / "typed.yaml"
    typed.write_text("loss:\n  clip_high: wide\n")
    with pytest.raises(ValueError, match=f"--config {typed}: loss.clip_high: expected float"):
        load_config(["--config", str(typed)])


@pytest.mark.slow  # a fresh interpreter importing torch
def test_missing_model_or_tokenizer_dir_is_a_user_error(tmp_path):
    missing = tmp_path / "no-model"
    commands = [
        ["evaluate.py", "--model", str(missing), "--task", "niah_single_1", "--lengths", "64",
         "--output-dir", str(tmp_path / "eval")],
        ["-m", "memagent.data", "--task", "niah_single_1", "--length", "64", "--num-samples", "1",
         "--tokenizer", str(missing), "--out", str(tmp_path / "o.json")],
    ]
    for command in commands:
        assert str(missing) in error_line(run(command))


@pytest.mark.slow  # a fresh interpreter importing torch
def test_ask_missing_document_is_a_user_error(tiny_model_dir, tmp_path):
    line = error_line(run(["-m", "memagent.ask", "--model", str(tiny_model_dir), "--document",
                           str(tmp_path / "none.txt"), "--question", "q"]))
    assert "none.txt" in line


@pytest.mark.slow  # a fresh interpreter importing torch
def test_serve_refuses_missing_model_and_warns_about_an_open_host_without_key(tmp_path):
    proc = run(["-m", "memagent.serve", "--model", str(tmp_path / "none"), "--host", "0.0.0.0"],
               {"MEMAGENT_API_KEY": ""})
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "no such directory" in proc.stderr
    assert "warning: serving on 0.0.0.0 without an API key" in proc.stderr


@pytest.mark.slow  # a fresh interpreter importing torch
def test_ctrl_c_in_train_names_the_output_dir_and_resume_latest(tmp_path):
    out = tmp_path / "run"
    # A suite started as a background job of a non-interactive shell inherits SIGINT ignored, and Python then
    # installs no KeyboardInterrupt handler; the child gets the default disposition back, as a terminal gives it.
    proc = subprocess.Popen([sys.executable, "train.py", "--preset", "smoke", "--output-dir", str(out)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        proc.stdout.readline()  # main() prints once the run is set up: the interrupt lands inside run_cli
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert str(out) in err and "--resume latest" in err


def test_run_cli_turns_value_errors_into_status_2_and_keeps_other_errors(capsys):
    def bad_value(argv: list[str]) -> int:
        raise ValueError("data.json line 3: field 'x'\nmust be a string")

    with pytest.raises(SystemExit) as stop:
        run_cli(bad_value, [])
    assert stop.value.code == 2
    assert capsys.readouterr().err == "error: data.json line 3: field 'x' must be a string\n"

    def bug(argv: list[str]) -> int:
        raise KeyError("ours")

    with pytest.raises(KeyError):
        run_cli(bug, [])


@pytest.mark.slow  # fresh interpreters importing torch
@pytest.mark.parametrize(
    "args",
    [["train.py", "--help"], ["evaluate.py", "--help"], ["-m", "memagent.ask", "--help"], ["-m", "memagent.serve", "--help"]],
)
def test_every_command_line_prints_its_help(args: list[str]) -> None:
    proc = run(args)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage:"), proc.stdout[:200]
    assert "error" not in proc.stderr


@pytest.mark.parametrize("flag, value", [("--batch-size", "0"), ("--num-samples", "0"), ("--lengths", "0"),
                                         ("--limit", "0"), ("--window", "-1")])
def test_evaluate_names_a_count_flag_below_one_before_loading_anything(flag, value, capsys):
    from memagent.evaluate import parse_args

    argv = ["--model", "m", "--task", "vt", "--lengths", "512", flag, value]
    with pytest.raises(SystemExit) as stop:
        parse_args(argv)
    assert stop.value.code == 2
    assert f"{flag} must be >= 1, got {value}" in capsys.readouterr().err


def test_ask_refuses_an_empty_question_or_document_before_loading_a_model(tmp_path, capsys):
    from memagent.ask import main

    blank, text = tmp_path / "blank.txt", tmp_path / "doc.txt"
    blank.write_text("  \n\n")
    text.write_text("The code is 42.")
    with pytest.raises(SystemExit, match=f"--document {blank}: no text to read"):
        main(["--model", str(tmp_path / "no-model"), "--document", str(blank), "--question", "What is the code?"])
    with pytest.raises(SystemExit) as stop:
        main(["--model", str(tmp_path / "no-model"), "--document", str(text), "--question", " "])
    assert stop.value.code == 2 and "--question is empty" in capsys.readouterr().err
