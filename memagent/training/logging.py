"""Rank-0 logging: one line per step, metrics as JSONL, TensorBoard when installed, text traces.

Metric keys are namespaced (`rollout/`, `loss/`, `perf/`, `eval/`); the console line shows a fixed selection.
Track reward and accuracy, not the loss: on-policy the surrogate is about 0 (TRL #3452).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from memagent.records import MEMORY, Trajectory

CONSOLE = (
    ("rollout/reward", "reward", "{:.3f}"), ("rollout/accuracy", "acc", "{:.3f}"),
    ("rollout/kept_groups", "kept", "{:.0f}"), ("rollout/answer_len", "resp_len", "{:.1f}"),
    ("rollout/memory_len", "mem_len", "{:.1f}"), ("loss/clipfrac", "clipfrac", "{:.3f}"),
    ("loss/approx_kl", "approx_kl", "{:.4f}"), ("loss/entropy", "entropy", "{:.3f}"),
    ("loss/grad_norm", "grad_norm", "{:.3f}"), ("perf/tokens_per_s", "tok/s", "{:.0f}"),
)


class MetricsLogger:
    """Writes metrics.jsonl (and TensorBoard events when `tensorboard` is importable) on rank 0 only."""

    def __init__(self, output_dir: str | Path, *, rank: int, after_step: int | None = None) -> None:
        """after_step: a resumed run's checkpoint step, or None for a run from the start.

        What metrics.jsonl already holds past that point is dropped first, since those steps run again: records of
        steps after the checkpoint (a stop after logging a step and before its checkpoint would otherwise leave it
        logged twice), and for a run from the start every record (a run that died before its first checkpoint
        starts again without --resume). A last line cut off by a kill mid-write goes too."""
        self.active = rank == 0
        self.dir = Path(output_dir)
        self.writer: Any = None
        if not self.active:
            return
        path = self.dir / "metrics.jsonl"
        if path.is_file():
            kept = records_up_to(path.read_text(), -1 if after_step is None else after_step, str(path))
            temporary = path.with_suffix(".jsonl.tmp")
            temporary.write_text("".join(kept))
            temporary.replace(path)  # atomic: a stop here leaves the old file or the new one, whole
        self.jsonl = path.open("a")
        try:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(self.dir / "tensorboard"))
        except ImportError:  # tensorboard is optional: JSONL is the record of the run
            self.writer = None

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Append one record and print the step's console line."""
        if not self.active:
            return
        self.jsonl.write(json.dumps({"step": step, **metrics}) + "\n")
        self.jsonl.flush()
        if self.writer is not None:
            for key, value in metrics.items():
                self.writer.add_scalar(key, value, step)
        print(console_line(step, metrics), flush=True)

    def close(self) -> None:
        if self.active:
            self.jsonl.close()
            if self.writer is not None:
                self.writer.close()


def records_up_to(text: str, last_step: int, source: str = "metrics.jsonl") -> list[str]:
    """The lines of metrics.jsonl text whose record's step is at most last_step (newline-terminated). A last line
    without its newline is a write cut off by a kill and is dropped; a broken line elsewhere raises, naming `source`
    and the line."""
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines.pop()
    kept = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            step = json.loads(line)["step"]
        except (ValueError, KeyError, TypeError) as err:
            raise ValueError(f"{source} line {number}: not a metrics record ({err}); remove the line to go on") from err
        if step <= last_step:
            kept.append(line)
    return kept


def console_line(step: int, metrics: dict[str, float]) -> str:
    """`step 3 | reward 0.375 | acc 0.375 | ...` with the keys present in metrics."""
    parts = [f"step {step}"]
    parts += [f"{label} {fmt.format(metrics[key])}" for key, label, fmt in CONSOLE if key in metrics]
    parts += [f"{key.removeprefix('eval/')} {value:.3f}" for key, value in metrics.items() if key.startswith("eval/")]
    return " | ".join(parts)


def write_traces(path: Path, step: int, trajectories: list[Trajectory], questions: list[str], golds: list[list[str]],
                 *, limit: int = 4) -> None:
    """Readable text: for a few trajectories, the question, the memory after each chunk, the answer, the reward."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [f"# step {step}  ({time.strftime('%Y-%m-%d %H:%M:%S')})", ""]
    for n, traj in enumerate(trajectories[:limit]):
        lines.append(f"## trajectory {n} (question {traj.sample_index})")
        lines.append(f"question: {questions[n]}")
        lines.append(f"gold: {golds[n]}")
        for conv in traj.conversations:
            if conv.kind == MEMORY:
                cut = "" if conv.finished else "  [cut at the memory budget]"
                decision = f" [{conv.decision}]" if conv.decision else ""  # gated memory, docs/gates.md
                lines.append(f"memory after chunk {conv.chunk_index}{decision}: {conv.text!r}{cut}")
        lines.append(f"answer: {traj.answer!r}")
        if traj.reward is not None:
            lines.append(f"reward: {traj.reward.total:.3f}  correct: {traj.reward.correct:.2f}")
        lines.append("")
    path.write_text("\n".join(lines))
