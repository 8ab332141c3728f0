"""Driver for test_faults.py: train.py on the smoke preset with test_train.py's stand-in reward (the answer's length
parity: the random smoke model never answers right, so without it every group would be uninformative and the update
empty), under one backend, or under each backend in turn in one launch.

usage: torchrun --nproc_per_node 2 tests/train/smoke_train.py BACKEND OUT [train.py flags]
         BACKEND ddp, zero2 or zero3: train.py's command line (run_cli) into OUT;
         BACKEND each: ddp, zero2 and zero3 one after the other into OUT/ddp, OUT/zero2, OUT/zero3.

KILL_IN_CHECKPOINT=STEP:RANK in the environment: rank RANK sends itself SIGKILL at its first torch.save into the
temporary directory of checkpoint STEP, i.e. in the middle of that checkpoint's write (rank 0 has written model/,
DeepSpeed may be writing the other rank's partition).

At exit, after every other exit handler, the driver prints "process group open at exit: BOOL" (test_faults.py checks
False: a gloo group left open when the interpreter finalizes can abort a rank with SIGABRT after its run finished).
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
from pathlib import Path
from typing import Any

import torch

from memagent import train
from memagent.cli import run_cli
from memagent.rl import rewards

BACKENDS = {"ddp": [], "zero2": ["--deepspeed", "configs/ds_zero2.json"],
            "zero3": ["--deepspeed", "configs/ds_zero3.json"]}


def kill_in_checkpoint(spec: str) -> None:
    """Wrap torch.save so that this rank dies (SIGKILL, no cleanup) at its first save into .tmp-step_STEP."""
    step, rank = (int(x) for x in spec.split(":"))
    if int(os.environ.get("RANK", 0)) != rank:
        return
    real_save, marker = torch.save, f".tmp-step_{step:06d}"

    def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        if marker in Path(str(f)).parts:
            os.kill(os.getpid(), signal.SIGKILL)
        real_save(obj, f, *args, **kwargs)

    torch.save = save


def report_open_group_at_exit() -> None:
    print(f"process group open at exit: {torch.distributed.is_initialized()}", flush=True)


def main(backend: str, out: str, flags: list[str]) -> None:
    atexit.register(report_open_group_at_exit)  # registered first, so it runs after the handlers a run registers
    rewards.VERIFIERS["strict"] = lambda response, golds: float(len(response) % 2)
    if os.environ.get("KILL_IN_CHECKPOINT"):
        kill_in_checkpoint(os.environ["KILL_IN_CHECKPOINT"])
    smoke = ["--preset", "smoke", *flags]
    if backend == "each":
        for name, backend_flags in BACKENDS.items():
            train.main([*smoke, "--output-dir", str(Path(out) / name), *backend_flags])
    else:
        run_cli(train.main, [*smoke, "--output-dir", out, *BACKENDS[backend]])


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
