"""Do the gates save time, or only tokens? The gated demo against its ungated twin, held out, batched and alone.

    OMP_NUM_THREADS=2 .venv/bin/python bench/gated_wall.py --ungated runs/tiny-4chunks-seed0 \\
        --gated runs/tiny-gates-seed0 [--set 16x --questions 16 --repeats 2]

For each run (a finished train.py run of the demo: its config.json and latest checkpoint), the first --questions of
its held-out set --set go through `memagent.training.heldout.heldout_metrics`, greedy, exactly as training's held-out
evaluation runs them: once as one batch (the engine's rounds: every question at chunk k in one backend call, a
round as long as its longest response, docs/gates.md "The demo") and once one question at a time (batch 1: a
question's time is its own chunks and tokens). Reported per run and mode: wall seconds per question (best of
--repeats), generated tokens per question, chunks read, accuracy; then the twin's time over the gated run's per mode
beside the ratio of generated tokens. The demo's model is 0.1M parameters, so per-step overhead, not arithmetic,
dominates a CPU step: the ratios say what the engine makes of the policy's savings at this size, not at 135M.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

from memagent.config import load_config  # noqa: E402
from memagent.demo.gate_traces import model_dir  # noqa: E402
from memagent.demo.stage import DemoStage  # noqa: E402
from memagent.model import load_model, load_tokenizer  # noqa: E402
from memagent.rollout.sampling import SamplingParams  # noqa: E402
from memagent.training.heldout import heldout_metrics  # noqa: E402


@dataclass(frozen=True)
class Timing:
    seconds_per_question: float
    generated_tokens_per_question: float
    chunks_read_share: float
    accuracy: float


def time_run(run_dir: Path, set_name: str, questions: int, batch: int, repeats: int) -> Timing:
    """Best-of-`repeats` held-out timing of the run's latest checkpoint on the first `questions` of `set_name`."""
    cfg = load_config(["--config", str(run_dir / "config.json")])
    path = model_dir(run_dir, "final")
    tokenizer = load_tokenizer(path)
    samples = DemoStage(cfg).data(tokenizer)[1][set_name][:questions]
    model = load_model(path, dtype=torch.float32, device="cpu")
    best, metrics = float("inf"), {}
    for _ in range(repeats):
        start = time.perf_counter()
        metrics = heldout_metrics(model, tokenizer, samples, cfg.workflow, SamplingParams(temperature=0.0), rank=0,
                                  world_size=1, all_reduce_sum=lambda t: t, batch=batch, verifier=cfg.rollout.verifier)
        best = min(best, (time.perf_counter() - start) / len(samples))
    return Timing(best, metrics["generated_tokens_per_question"], metrics["chunks_read_share"], metrics["accuracy"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ungated", type=Path, required=True, help="a finished tiny-4chunks run directory")
    parser.add_argument("--gated", type=Path, required=True, help="a finished tiny-gates run directory")
    parser.add_argument("--set", default="16x", help="held-out set name (default 16x)")
    parser.add_argument("--questions", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, set {args.set}, {args.questions} questions")
    print("| run | mode | seconds per question | generated tokens per question | chunks read (%) | accuracy (%) |")
    print("|---|---|---|---|---|---|")
    results: dict[tuple[str, str], Timing] = {}
    for label, run_dir in (("ungated", args.ungated), ("gated", args.gated)):
        for mode, batch in (("batched", args.questions), ("alone", 1)):
            t = time_run(run_dir, args.set, args.questions, batch, args.repeats)
            results[label, mode] = t
            print(f"| {label} | {mode} | {t.seconds_per_question:.3f} | {t.generated_tokens_per_question:.1f} | "
                  f"{100 * t.chunks_read_share:.0f} | {100 * t.accuracy:.1f} |")
    for mode in ("batched", "alone"):
        u, g = results["ungated", mode], results["gated", mode]
        print(f"{mode}: ungated / gated time {u.seconds_per_question / g.seconds_per_question:.2f}x, "
              f"generated tokens {u.generated_tokens_per_question / g.generated_tokens_per_question:.2f}x")
    print(json.dumps({f"{k[0]}_{k[1]}": v.__dict__ for k, v in results.items()}))


if __name__ == "__main__":
    main()
