"""Do the gates save time, or only tokens? The gated demo against its ungated twin, held out: one question at a time,
in fixed batches, and streamed (continuous batching by rounds).

    OMP_NUM_THREADS=2 .venv/bin/python bench/gated_wall.py --ungated runs/tiny-4chunks-seed0 \\
        --gated runs/tiny-gates-seed0 [--set 16x --questions 64 --in-flight 16 --repeats 2]

For each run (a finished train.py run of the demo: its config.json and latest checkpoint), the first --questions of
its held-out set --set go through `memagent.training.heldout.heldout_metrics`, greedy, exactly as training's held-out
evaluation runs them, in three modes:
- alone: one question at a time (a question's time is its own chunks and tokens);
- batches: --in-flight questions at a time, each batch run to its end before the next starts (every question at
  chunk k in one backend call, a round as long as its longest response, and the batch as long as its question that
  reads furthest: docs/gates.md "The demo");
- streamed: --in-flight questions in flight, a finished question's slot going to the next one at the following round
  (memagent.rollout.scheduler, what evaluate.py and held-out evaluation in training do).
Reported per run and mode: wall seconds per question (best of --repeats), generated tokens per question, chunks
read, accuracy; then the twin's time over the gated run's per mode beside the ratio of generated tokens. The demo's
model is 0.1M parameters, so per-step overhead, not arithmetic, dominates a CPU step: the ratios say what the engine
makes of the policy's savings at this size, not at 135M.
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


def time_run(run_dir: Path, set_name: str, questions: int, in_flight: int, fixed_batches: bool,
             repeats: int) -> Timing:
    """Best-of-`repeats` held-out timing of the run's latest checkpoint on the first `questions` of `set_name`,
    `in_flight` questions at a time, streamed or (`fixed_batches`) batch after batch."""
    cfg = load_config(["--config", str(run_dir / "config.json")])
    path = model_dir(run_dir, "final")
    tokenizer = load_tokenizer(path)
    samples = DemoStage(cfg).data(tokenizer)[1][set_name][:questions]
    model = load_model(path, dtype=torch.float32, device="cpu")
    parts = [samples[i : i + in_flight] for i in range(0, len(samples), in_flight)] if fixed_batches else [samples]
    best, metrics = float("inf"), []
    for _ in range(repeats):
        start = time.perf_counter()
        metrics = [heldout_metrics(model, tokenizer, part, cfg.workflow, SamplingParams(temperature=0.0), rank=0,
                                   world_size=1, all_reduce_sum=lambda t: t, batch=in_flight,
                                   verifier=cfg.rollout.verifier) for part in parts]
        best = min(best, (time.perf_counter() - start) / len(samples))
    weights = [len(part) / len(samples) for part in parts]

    def mean(key: str) -> float:
        return sum(w * m[key] for w, m in zip(weights, metrics))

    return Timing(best, mean("generated_tokens_per_question"), mean("chunks_read_share"), mean("accuracy"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ungated", type=Path, required=True, help="a finished tiny-4chunks run directory")
    parser.add_argument("--gated", type=Path, required=True, help="a finished tiny-gates run directory")
    parser.add_argument("--set", default="16x", help="held-out set name (default 16x)")
    parser.add_argument("--questions", type=int, default=64)
    parser.add_argument("--in-flight", type=int, default=16, help="questions at a time in the batched modes")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, set {args.set}, {args.questions} questions, "
          f"{args.in_flight} in flight")
    print("| run | mode | seconds per question | generated tokens per question | chunks read (%) | accuracy (%) |")
    print("|---|---|---|---|---|---|")
    modes = {"alone": (1, True), "batches": (args.in_flight, True), "streamed": (args.in_flight, False)}
    results: dict[tuple[str, str], Timing] = {}
    for label, run_dir in (("ungated", args.ungated), ("gated", args.gated)):
        for mode, (in_flight, fixed) in modes.items():
            t = time_run(run_dir, args.set, args.questions, in_flight, fixed, args.repeats)
            results[label, mode] = t
            print(f"| {label} | {mode} | {t.seconds_per_question:.3f} | {t.generated_tokens_per_question:.1f} | "
                  f"{100 * t.chunks_read_share:.0f} | {100 * t.accuracy:.1f} |", flush=True)
    for mode in modes:
        u, g = results["ungated", mode], results["gated", mode]
        print(f"{mode}: ungated / gated time {u.seconds_per_question / g.seconds_per_question:.2f}x, "
              f"generated tokens {u.generated_tokens_per_question / g.generated_tokens_per_question:.2f}x")
    print(json.dumps({f"{k[0]}_{k[1]}": v.__dict__ for k, v in results.items()}))


if __name__ == "__main__":
    main()
