"""Faults of two-rank runs on CPU (gloo), on the smoke preset through tests/train/smoke_train.py:

- a rank killed (SIGKILL) under torchrun in the middle of a step or of a checkpoint write, under DDP, DeepSpeed ZeRO-2
  and ZeRO-3: `--resume latest` then gives the metrics of an uninterrupted run;
- ranks started without a launcher that watches them (as on two nodes): when one stops answering, the other fails
  with the backend's timeout error within run.collective_timeout_s instead of waiting;
- a DeepSpeed checkpoint resumes in one plain process, with the AdamW state of the DDP run;
- a rank closes its process group before the interpreter finalizes (one left open can abort a finished rank).

Launches: one for the three uninterrupted runs, two per backend (killed, resumed), one pair without a launcher; each
bounded by a timeout that kills its whole process group. OMP_NUM_THREADS=1 so two ranks fit two cores.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from memagent import train
from memagent.config import load_config
from memagent.demo import DemoStage
from memagent.model import load_model
from memagent.rl import rewards
from memagent.training.checkpoint import load_checkpoint
from memagent.training.learner import Learner

ROOT = Path(__file__).resolve().parents[2]
DRIVER = "tests/train/smoke_train.py"
STEPS = 3
ENV = {"OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu", "PYTHONPATH": str(ROOT)}
KILL_SEED = 31
"""Seeds the kill moments. 31: rank 0 mid-step 3 under DDP, rank 1 in ZeRO-2's checkpoint 3 write, rank 0 in
ZeRO-3's checkpoint 2 write (a test checks that a step and writes by both ranks are covered)."""
TIMEOUT_S = 20


@dataclass(frozen=True)
class KillMoment:
    """When one case kills a rank (drawn from KILL_SEED and the backend)."""

    rank: int
    """The rank killed (0 also hosts the rendezvous store and renames checkpoints into place)."""
    step: int
    """2 or 3: a step after the first checkpoint, so that `--resume latest` has one to resume from."""
    in_checkpoint: bool
    """True: the rank kills itself at its first file of checkpoint `step` (a write lasts about 10 ms); False: SIGKILL
    from the test `delay_s` after checkpoint `step - 1` is in place, while step `step` runs."""
    delay_s: float
    """Seconds between checkpoint `step - 1` and the kill (a step takes about 0.4 s)."""


def kill_moment(backend: str) -> KillMoment:
    rng = random.Random(f"{KILL_SEED}:{backend}")
    return KillMoment(rank=rng.randrange(2), step=rng.choice((2, 3)), in_checkpoint=rng.random() < 0.5,
                      delay_s=round(rng.uniform(0.0, 0.3), 3))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(cmd: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """A process in its own process group (killing the group takes its workers too), its output in `log` (a pipe
    that nobody reads while the test waits for a marker could fill up and stall the run)."""
    with log.open("w") as sink:
        return subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, **ENV, **(env or {})}, stdout=sink,
                                stderr=subprocess.STDOUT, start_new_session=True)


def finish(proc: subprocess.Popen[bytes], log: Path, timeout_s: float) -> tuple[int, str]:
    """Wait for the process; past timeout_s kill its group and fail. Returns (exit status, output)."""
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        pytest.fail(f"{log.stem} ran over {timeout_s} s:\n{log.read_text()[-3000:]}")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # workers left behind by a launcher that exited
        except ProcessLookupError:
            pass
    return proc.returncode, log.read_text()


def torchrun(log: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    return start([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                  str(free_port()), DRIVER, *args], log, env)


def rank_pid(launcher: int, rank: int) -> int:
    """The pid of the launcher's worker of that rank (a child whose environment holds RANK=rank)."""
    for task in Path(f"/proc/{launcher}/task").iterdir():
        for child in (task / "children").read_text().split():
            if f"RANK={rank}".encode() in Path(f"/proc/{child}/environ").read_bytes().split(b"\0"):
                return int(child)
    raise LookupError(f"no worker of rank {rank} under pid {launcher}")


def wait_for(path: Path, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"{path} never appeared (exit status {proc.poll()})")
        time.sleep(0.01)


def final_records(out: Path) -> dict[tuple[int, bool], dict[str, float]]:
    """The last record of each step (training and evaluation records apart), timing fields dropped: a resumed run
    logs again the steps after its checkpoint."""
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {(r["step"], "rollout/reward" in r): {k: v for k, v in r.items() if not k.startswith("perf/")}
            for r in records}


@pytest.fixture(scope="module")
def model_flags(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """The flags every run shares, with the smoke model, built here as train.py's demo stage builds it."""
    model_dir = tmp_path_factory.mktemp("smoke") / "model"
    DemoStage(load_config(["--preset", "smoke", "--demo.model-dir", str(model_dir)])).model_path(0, lambda: None)
    return ["--demo.model-dir", str(model_dir), "--data.num-eval", "2", "--run.steps", str(STEPS)]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory, model_flags: list[str]) -> Path:
    """Uninterrupted two-rank runs: OUT/ddp, OUT/zero2, OUT/zero3 (one launch)."""
    out = tmp_path_factory.mktemp("uninterrupted")
    log = out / "launch.log"
    status, output = finish(torchrun(log, "each", str(out), *model_flags), log, timeout_s=240)
    assert status == 0, output[-3000:]
    return out


@pytest.mark.multiprocess
def test_a_two_rank_process_closes_its_process_group_before_the_interpreter_finalizes(uninterrupted: Path) -> None:
    # (True|False), not a word: the two ranks share the log, and one rank's line can land before the other's newline
    lines = re.findall(r"process group open at exit: (True|False)", (uninterrupted / "launch.log").read_text())
    assert lines == ["False", "False"], lines  # one line per rank


def test_the_seeded_kill_moments_cover_a_step_and_checkpoint_writes_of_both_ranks() -> None:
    moments = [kill_moment(backend) for backend in ("ddp", "zero2", "zero3")]
    assert any(not m.in_checkpoint for m in moments)
    assert {m.rank for m in moments if m.in_checkpoint} == {0, 1}


@pytest.mark.multiprocess
@pytest.mark.parametrize("backend", ["ddp", "zero2", "zero3"])
def test_a_rank_killed_mid_step_or_mid_checkpoint_resumes_to_the_uninterrupted_metrics(
        backend: str, uninterrupted: Path, model_flags: list[str], tmp_path: Path) -> None:
    moment, out, root = kill_moment(backend), tmp_path / "run", tmp_path / "run" / "checkpoints"
    env = {"KILL_IN_CHECKPOINT": f"{moment.step}:{moment.rank}"} if moment.in_checkpoint else {}
    killed, resumed = tmp_path / "killed.log", tmp_path / "resumed.log"
    run = torchrun(killed, backend, str(out), *model_flags, env=env)
    if not moment.in_checkpoint:
        wait_for(root / f"step_{moment.step - 1:06d}", run, timeout_s=120)
        time.sleep(moment.delay_s)
        os.kill(rank_pid(run.pid, moment.rank), signal.SIGKILL)
    status, output = finish(run, killed, timeout_s=180)
    assert status != 0, f"{moment}: the run ended before the kill\n{output[-2000:]}"
    if moment.in_checkpoint:  # the write was cut: its temporary directory stays, the checkpoint never appears
        cut, whole = root / f".tmp-step_{moment.step:06d}", root / f"step_{moment.step:06d}"
        assert cut.is_dir() and not whole.exists(), moment

    status, output = finish(torchrun(resumed, backend, str(out), *model_flags, "--resume", "latest"), resumed,
                            timeout_s=180)
    assert status == 0, f"{moment}\n{output[-3000:]}"
    assert final_records(out) == final_records(uninterrupted / backend), moment
    assert not list(root.glob(".tmp-*")) and (root / f"step_{STEPS:06d}" / "trainer_state.json").is_file()


def plain_learner(checkpoint: Path, model_dir: str) -> Learner:
    """One plain process, the smoke run's optimizer settings, restored from a checkpoint of any backend."""
    cfg = load_config(["--preset", "smoke"])
    learner = Learner(load_model(model_dir, dtype=torch.float32, device="cpu").train(), cfg.optim, torch.device("cpu"),
                      local=True)
    load_checkpoint(learner, checkpoint, torch.Generator())
    return learner


@pytest.mark.multiprocess
def test_a_deepspeed_checkpoint_resumes_in_one_plain_process_with_the_ddp_runs_optimizer_state(
        uninterrupted: Path, model_flags: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model_dir, last = model_flags[1], Path("checkpoints") / f"step_{STEPS:06d}"
    ddp = plain_learner(uninterrupted / "ddp" / last, model_dir)
    for stage in ("zero2", "zero3"):
        learner = plain_learner(uninterrupted / stage / last, model_dir)
        assert learner.lr == ddp.lr and learner.scheduler.last_epoch == ddp.scheduler.last_epoch == STEPS
        for (name, p), q in zip(ddp.unwrapped.named_parameters(), learner.unwrapped.parameters(), strict=True):
            torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-6, msg=f"{stage} {name}")
            mine, ref = learner.optimizer.state[q], ddp.optimizer.state[p]
            assert float(mine["step"]) == float(ref["step"]) == STEPS
            for key in ("exp_avg", "exp_avg_sq"):  # the two runs agree to float32 reduction order
                scale = float(ref[key].abs().max())
                torch.testing.assert_close(mine[key], ref[key], rtol=0, atol=1e-5 * scale, msg=f"{stage} {name} {key}")
    out = tmp_path / "zero3_then_plain"
    shutil.copytree(uninterrupted / "zero3", out)
    monkeypatch.setitem(rewards.VERIFIERS, "strict", lambda response, golds: float(len(response) % 2))
    train.main(["--preset", "smoke", *model_flags, "--output-dir", str(out), "--run.steps", str(STEPS + 1),
                "--resume", "latest"])
    assert final_records(out)[(STEPS + 1, True)]["loss/grad_norm"] > 0


@pytest.mark.multiprocess
def test_without_a_launcher_a_rank_whose_peer_stops_answering_fails_within_the_collective_timeout(
        model_flags: list[str], tmp_path: Path) -> None:
    """Two ranks started by hand, as on two nodes. A killed process on the same host has its sockets closed by the
    kernel, and gloo fails at once (1 s here); a dead node closes nothing, which a stopped process reproduces: then
    only the collective timeout ends the wait (gloo's default is 30 min)."""
    port, out = str(free_port()), tmp_path / "run"
    cmd = [sys.executable, DRIVER, "ddp", str(out), *model_flags, "--run.steps", "50",
           "--run.collective-timeout-s", str(TIMEOUT_S)]
    logs = [tmp_path / f"rank{r}.log" for r in (0, 1)]
    ranks = [start(cmd, logs[r], {"RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
                                  "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}) for r in (0, 1)]
    try:
        wait_for(out / "checkpoints" / "step_000001", ranks[0], timeout_s=120)
        ranks[1].send_signal(signal.SIGSTOP)
        stopped = time.monotonic()
        status, output = finish(ranks[0], logs[0], timeout_s=TIMEOUT_S + 15)
        waited = time.monotonic() - stopped
    finally:
        ranks[1].kill()
        ranks[1].wait()
    assert status != 0 and waited < TIMEOUT_S + 15
    assert re.search(rf"Timed out waiting {TIMEOUT_S * 1000}ms", output), output[-3000:]
