"""Peak memory of a real training step against what `train.py --dry-run` predicts for the same configuration.

    .venv/bin/python bench/peak_memory.py [train.py flags ...]      e.g. --preset smoke --run.output-dir runs/pm

Prints the dry run's two estimates (rollout and update, per GPU), runs one RL step of train.py in this process with
the same flags (`--run.steps 1` appended), and reports the measured peak beside the larger estimate:
- CUDA: torch.cuda.max_memory_allocated over the step (what the estimates model: tensors on the device);
- CPU: the growth of the process's peak resident set over the step, which also counts the allocator's cached
  blocks and the Python objects of the rollout, so it is only a rough check there.
The last line is `peak memory: measured X GiB, predicted Y GiB (ratio R)`.
"""

from __future__ import annotations

import re
import resource
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

from memagent import train  # noqa: E402
from memagent.config import load_config  # noqa: E402
from memagent.training.memory_budget import dry_run_report  # noqa: E402

GIB = 2**30


def predicted_gib(report: str) -> dict[str, float]:
    """{"rollout": GiB, "update": GiB} from dry_run_report's "rollout: X GiB" and "update: Y GiB" lines."""
    return {phase: float(re.search(rf"^{phase}: ([0-9.]+) GiB", report, re.MULTILINE).group(1))
            for phase in ("rollout", "update")}


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def main(argv: list[str]) -> None:
    argv = [*argv, "--run.steps", "1"]
    cfg = load_config(argv)
    report = dry_run_report(cfg, world_size=1)
    print(report, flush=True)
    predicted = predicted_gib(report)
    cuda = torch.cuda.is_available() and cfg.run.device != "cpu"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    before = peak_rss_bytes()
    train.main(argv)
    measured = torch.cuda.max_memory_allocated() if cuda else peak_rss_bytes() - before
    bound = max(predicted.values())
    print(f"peak memory: measured {measured / GIB:.2f} GiB ({'CUDA allocated' if cuda else 'CPU peak RSS growth'}), "
          f"predicted {bound:.2f} GiB (ratio {measured / GIB / max(bound, 1e-9):.2f})", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
