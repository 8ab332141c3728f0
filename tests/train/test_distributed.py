"""Two-process runs on CPU (gloo): the backends' updates match one process (DDP, ZeRO-2, ZeRO-3, KL with an uneven
number of micro-batches, ZeRO-3 with every parameter partitioned after rollouts of different chunk counts, bf16
gradients accumulated in fp32: dist_update.py), and train.py on the tiny preset with its warm start under ZeRO-1,
ZeRO-2 (through `accelerate launch`) and partitioned ZeRO-3 (dist_train.py). Two launches in all; OMP_NUM_THREADS=1
so two ranks fit two cores. Every launch is bounded by a timeout that kills its process group: a hang fails."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

from memagent.demo.task import corpus
from memagent.model import build_tiny_model
from memagent.training.learner import resolve_deepspeed_path

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch(cmd: list[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    """Run a launcher in its own process group, so a hang or a timeout kills the workers too (killing only the
    launcher would leave its rank processes running)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu", "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{' '.join(cmd[2:])} ran over {timeout_s} s:\n{out[-3000:]}\n{err[-3000:]}")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # rank processes left behind by a launcher that exited
        except ProcessLookupError:
            pass
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def torchrun(*args: str, timeout_s: float = 240) -> subprocess.CompletedProcess[str]:
    return launch([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                   str(free_port()), *args], timeout_s)


@pytest.mark.multiprocess
def test_two_rank_updates_match_the_single_process_update_on_every_backend(tmp_path: Path) -> None:
    model = build_tiny_model(tmp_path / "model", hidden_size=32, num_layers=2, intermediate_size=64,
                             vocab_size=512, corpus=corpus())
    done = torchrun("tests/train/dist_update.py", str(model), timeout_s=180)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for name in ("DDP", "ZeRO-2", "ZeRO-3", "DDP KL", "ZeRO-3 partitioned"):
        assert f"{name}: parameters match" in done.stdout, done.stdout[-3000:]
    for stage in (1, 2):
        assert f"ZeRO-{stage} bf16: gradients accumulate in fp32" in done.stdout, done.stdout[-3000:]


@pytest.mark.multiprocess
def test_tiny_preset_with_warm_start_under_zero_1_2_3_starts_rl_from_the_warm_started_weights(tmp_path: Path) -> None:
    out = tmp_path / "runs"
    done = launch([sys.executable, "-m", "accelerate.commands.launch", "--use_deepspeed", "--deepspeed_config_file",
                   "configs/ds_zero2.json", "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no",
                   "--dynamo_backend", "no", "--main_process_port", str(free_port()), "tests/train/dist_train.py",
                   str(out), str(tmp_path / "tiny")], timeout_s=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    initial = load_file(str(tmp_path / "tiny" / "model.safetensors"))
    for stage in ("zero1", "zero2", "zero3"):
        run = out / stage
        warm = load_file(str(run / "warm_start" / "model.safetensors"))
        after_rl = load_file(str(run / "checkpoints" / "step_000001" / "model" / "model.safetensors"))
        assert warm.keys() == after_rl.keys() == initial.keys()
        assert any(not warm[k].equal(initial[k]) for k in warm), f"{stage}: the warm start changed nothing"
        moved = [k for k in warm if float((warm[k] - after_rl[k]).abs().max()) > 1e-20]  # the warm start moved 1e-2
        assert not moved, f"{stage}: RL (lr 1e-30) did not start from the warm-started weights: {moved[:3]}"
        assert (run / "checkpoints" / "step_000001" / "deepspeed").is_dir(), f"{stage}: not run by DeepSpeed"
        assert (run / "checkpoints" / "step_000001" / "rng_rank1.pt").is_file()
        step = [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "loss/kl" in r]
        assert step and step[0]["loss/kl"] == 0.0, f"{stage}: the KL reference is not the warm-started policy"
        assert step[0]["loss/grad_norm"] > 0


def test_accelerate_deepspeed_config_file_is_honoured_and_plugin_only_settings_are_refused() -> None:
    env = {"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_CONFIG_FILE": "configs/ds_zero3.json"}
    assert resolve_deepspeed_path("", env) == "configs/ds_zero3.json"
    assert resolve_deepspeed_path("configs/ds_zero3.json", env) == "configs/ds_zero3.json"
    assert resolve_deepspeed_path("configs/ds_zero1.json", {}) == "configs/ds_zero1.json"
    with pytest.raises(ValueError, match="differ"):
        resolve_deepspeed_path("configs/ds_zero1.json", env)
    with pytest.raises(ValueError, match="deepspeed_config_file"):
        resolve_deepspeed_path("", {"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_ZERO_STAGE": "2"})
