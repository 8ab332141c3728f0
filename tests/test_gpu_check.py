"""bench/gpu_check.sh end to end in its CPU dry mode: every step runs and the table reports each one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STEPS = ("gpu-tests", "train-plain-bf16", "train-zero2", "train-zero3", "rollout-memagent-order",
         "rollout-section-first", "peak-memory")


@pytest.mark.slow
def test_gpu_check_cpu_dry_runs_every_step_and_writes_one_table(tmp_path: Path) -> None:
    env = {**os.environ, "PY": sys.executable, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")}
    done = subprocess.run(["bash", "bench/gpu_check.sh", "--cpu-dry", "--out", str(tmp_path)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    table = (tmp_path / "gpu_check.md").read_text()
    assert done.returncode == 0, table + done.stderr[-2000:]
    rows = {line.split("|")[1].strip(): line for line in table.splitlines() if line.startswith("| ") and "---" not in line}
    assert set(STEPS) <= set(rows), table
    for name in STEPS:
        assert "| ok |" in rows[name], rows[name]
    assert "skipped" in rows["gpu-tests"]  # no CUDA here: the gpu group skips, cleanly
    assert "grad_norm" in rows["train-zero3"] and "HF/on" in rows["rollout-section-first"]
    assert "predicted" in rows["peak-memory"]
    assert done.stdout.strip().endswith(rows["peak-memory"].strip())  # the table is printed at the end
