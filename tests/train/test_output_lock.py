"""One training run per output directory (memagent.dirlock): a second train.py on a directory in use stops before
writing anything, naming the process that holds it; the lock lasts exactly as long as the run, and each rank of a
distributed run holds its own."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from memagent import train
from memagent.cli import run_cli
from memagent.dirlock import OutputDirBusy, lock_output_dir
from memagent.rl import rewards
from tests.train.test_train import records, smoke


@pytest.fixture(autouse=True)
def parity_reward(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(rewards.VERIFIERS, "strict", lambda response, golds: float(len(response) % 2))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("lock_model") / "model")


@pytest.fixture
def held(tmp_path: Path) -> Iterator[tuple[Path, subprocess.Popen[str]]]:
    """An output directory whose lock another live process holds (SIGKILLed afterwards: the kernel frees it)."""
    out = tmp_path / "run"
    out.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", "import time; from pathlib import Path; from memagent.dirlock import lock_output_dir; "
         f"lock = lock_output_dir(Path({str(out)!r})); print('locked', flush=True); time.sleep(120)"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        yield out, holder
    finally:
        holder.kill()
        holder.wait()


def test_a_second_run_on_a_directory_in_use_stops_naming_the_holder_and_writes_nothing(
        held: tuple[Path, subprocess.Popen[str]], model_dir: str, capsys: pytest.CaptureFixture[str]) -> None:
    out, holder = held
    before = sorted(p.name for p in out.iterdir())
    with pytest.raises(SystemExit) as stop:
        run_cli(train.main_or_lost_rank, ["--preset", "smoke", "--output-dir", str(out), "--demo.model-dir", model_dir,
                                          "--run.steps", "1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(err) == 1
    assert f"pid {holder.pid}" in err[0] and str(out) in err[0]
    assert sorted(p.name for p in out.iterdir()) == before  # no config.json, metrics.jsonl or checkpoints
    holder.kill()
    holder.wait()
    smoke(out, model_dir, "--run.steps", "1")  # the holder is gone, and so is its lock
    assert any(r.get("step") == 1 for r in records(out))


def test_the_lock_is_held_while_the_run_works_and_released_when_it_ends_or_fails(
        tmp_path: Path, model_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "run"
    seen: list[str] = []

    def probing_verifier(response: str, golds: list[str]) -> float:  # runs mid-step, inside train.main
        try:
            lock_output_dir(out).close()
            seen.append("free")
        except OutputDirBusy:
            seen.append("busy")
        return float(len(response) % 2)

    monkeypatch.setitem(rewards.VERIFIERS, "strict", probing_verifier)
    smoke(out, model_dir, "--run.steps", "1")
    assert seen and set(seen) == {"busy"}
    lock_output_dir(out).close()  # released after a finished run

    def interrupted(response: str, golds: list[str]) -> float:
        raise KeyboardInterrupt

    monkeypatch.setitem(rewards.VERIFIERS, "strict", interrupted)
    with pytest.raises(KeyboardInterrupt):
        smoke(out, model_dir, "--run.steps", "2", "--resume", "latest")
    lock_output_dir(out).close()  # released after a stopped one, so the same process can resume at once


def test_each_rank_holds_its_own_lock_file(tmp_path: Path) -> None:
    rank0, rank1 = lock_output_dir(tmp_path), lock_output_dir(tmp_path, rank=1)
    try:
        for rank in (0, 1):
            with pytest.raises(OutputDirBusy):
                lock_output_dir(tmp_path, rank=rank)
        assert (tmp_path / ".lock").read_text() == (tmp_path / ".lock-rank1").read_text()  # this pid, twice
    finally:
        rank0.close()
        rank1.close()
    lock_output_dir(tmp_path, rank=1).close()
