"""Do the gates save time, or only tokens? The gated demo against its ungated twin, held out: one question at a time,
in fixed batches, and streamed (continuous batching by rounds).

    OMP_NUM_THREADS=2 .venv/bin/python bench/gated_wall.py --ungated runs/tiny-4chunks-seed0 \\
        --gated runs/tiny-gates-seed0 [--set 16x --questions 64 --alone 16 --in-flight 16 --repeats 2]

For each run (a finished train.py run of the demo: its config.json and latest checkpoint), the first --questions of
its held-out set --set go through `memagent.training.heldout.heldout_metrics`, greedy, exactly as training's held-out
evaluation runs them, in three modes:
- alone: one question at a time, on the first --alone of them (a question's time is its own chunks and tokens);
- batches: --in-flight questions at a time, each batch run to its end before the next starts (every question at
  chunk k in one backend call, a round as long as its longest response, and the batch as long as its question that
  reads furthest: docs/gates.md "The demo");
- streamed: --in-flight questions in flight, a finished question's slot going to the next one at the following round
  (memagent.rollout.scheduler, what evaluate.py and held-out evaluation in training do).
The modes take turns within each repeat. Reported per run and mode: wall seconds per question (best of --repeats),
generated tokens per question, chunks read, accuracy; then the twin's time over the gated run's per mode beside the
ratio of generated tokens. The twin's documents all have the same length, so its batches and streamed modes run the
same backend calls: their difference is the measurement's noise. The demo's model is 0.1M parameters, so per-step
overhead, not arithmetic, dominates a CPU step: the ratios say what the engine makes of the policy's savings at this
size, not at 135M.
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


def time_modes(run_dir: Path, set_name: str, questions: int, alone: int, in_flight: int,
               repeats: int) -> dict[str, Timing]:
    """Held-out timings of the run's latest checkpoint on the first `questions` of `set_name` (the first `alone` of
    them one at a time), best of `repeats`; the modes take turns within each repeat, so a drift of the machine's
    speed over the run reaches them alike."""
    cfg = load_config(["--config", str(run_dir / "config.json")])
    path = model_dir(run_dir, "final")
    tokenizer = load_tokenizer(path)
    samples = DemoStage(cfg).data(tokenizer)[1][set_name][:questions]
    model = load_model(path, dtype=torch.float32, device="cpu")
    modes = {"alone": (samples[:alone], 1, True), "batches": (samples, in_flight, True),
             "streamed": (samples, in_flight, False)}
    best: dict[str, float] = dict.fromkeys(modes, float("inf"))
    metrics: dict[str, list[dict[str, float]]] = {}
    for _ in range(repeats):
        for mode, (chosen, width, fixed) in modes.items():
            parts = [chosen[i : i + width] for i in range(0, len(chosen), width)] if fixed else [chosen]
            start = time.perf_counter()
            metrics[mode] = [heldout_metrics(model, tokenizer, part, cfg.workflow, SamplingParams(temperature=0.0),
                                             rank=0, world_size=1, all_reduce_sum=lambda t: t, batch=width,
                                             verifier=cfg.rollout.verifier) for part in parts]
            best[mode] = min(best[mode], (time.perf_counter() - start) / len(chosen))

    def mean(mode: str, key: str) -> float:
        parts = metrics[mode]
        return sum(m[key] for m in parts) / len(parts)  # the parts are equal in size (questions % width == 0)

    return {mode: Timing(best[mode], mean(mode, "generated_tokens_per_question"), mean(mode, "chunks_read_share"),
                         mean(mode, "accuracy")) for mode in modes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ungated", type=Path, required=True, help="a finished tiny-4chunks run directory")
    parser.add_argument("--gated", type=Path, required=True, help="a finished tiny-gates run directory")
    parser.add_argument("--set", default="16x", help="held-out set name (default 16x)")
    parser.add_argument("--questions", type=int, default=64)
    parser.add_argument("--alone", type=int, default=16, help="of them, how many to time one at a time")
    parser.add_argument("--in-flight", type=int, default=16, help="questions at a time in the batched modes")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    if args.questions % args.in_flight or args.alone > args.questions:
        parser.error("--questions must be a multiple of --in-flight, and --alone at most --questions")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, set {args.set}, {args.questions} questions "
          f"({args.alone} alone), {args.in_flight} in flight, best of {args.repeats}")
    print("| run | mode | seconds per question | generated tokens per question | chunks read (%) | accuracy (%) |")
    print("|---|---|---|---|---|---|")
    results: dict[tuple[str, str], Timing] = {}
    for label, run_dir in (("ungated", args.ungated), ("gated", args.gated)):
        timed = time_modes(run_dir, args.set, args.questions, args.alone, args.in_flight, args.repeats)
        for mode, t in timed.items():
            results[label, mode] = t
            print(f"| {label} | {mode} | {t.seconds_per_question:.3f} | {t.generated_tokens_per_question:.1f} | "
                  f"{100 * t.chunks_read_share:.0f} | {100 * t.accuracy:.1f} |", flush=True)
    for mode in timed:
        u, g = results["ungated", mode], results["gated", mode]
        print(f"{mode}: ungated / gated time {u.seconds_per_question / g.seconds_per_question:.2f}x, "
              f"generated tokens {u.generated_tokens_per_question / g.generated_tokens_per_question:.2f}x")
    print(json.dumps({f"{k[0]}_{k[1]}": v.__dict__ for k, v in results.items()}))


if __name__ == "__main__":
    main()
