"""Two-process runs on CPU (gloo): DDP, DeepSpeed ZeRO-2 and ZeRO-3 updates match one process; train.py completes a
ZeRO-3 step under torchrun. Two torchrun launches in all; OMP_NUM_THREADS=1 so two ranks fit two cores."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from memagent.model import build_tiny_model

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.multiprocess


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def torchrun(*args: str, timeout_s: float = 240) -> subprocess.CompletedProcess[str]:
    """Launch 2 ranks in their own process group, so a hang or a timeout kills the workers too (killing only
    torchrun would leave its rank processes running)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()), *args]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"torchrun {' '.join(args)} ran over {timeout_s} s:\n{out[-3000:]}\n{err[-3000:]}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def test_ddp_zero2_and_zero3_updates_match_the_single_process_update(tmp_path: Path) -> None:
    model = build_tiny_model(tmp_path / "model", hidden_size=32, num_layers=2, intermediate_size=64)
    done = torchrun("tests/train/dist_update.py", str(model))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for name in ("DDP", "ZeRO-2", "ZeRO-3"):
        assert f"{name}: parameters match" in done.stdout, done.stdout[-3000:]


def test_train_py_completes_a_zero3_step_under_torchrun(tmp_path: Path) -> None:
    out = tmp_path / "run"
    done = torchrun("train.py", "--preset", "smoke", "--deepspeed", "configs/ds_zero3.json", "--run.steps", "1",
                    "--output-dir", str(out), "--model.tiny-dir", str(tmp_path / "model"), "--data.num-eval", "2")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "step 1 |" in done.stdout
    assert (out / "checkpoints" / "step_000001" / "model" / "model.safetensors").is_file()
    assert (out / "checkpoints" / "step_000001" / "rng_rank1.pt").is_file()
