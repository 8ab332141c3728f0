"""Figures for a training report: held-out accuracy against document length (several evaluate.py runs side by
side) and the sampled training accuracy against RL step (train.py's metrics.jsonl).

    python -m memagent.evaluation.figures --out docs/figures/smollm2_rl.png \\
        --results untrained=runs/smollm2-eval/untrained/results.json seed1=runs/smollm2-eval/smollm2-seed1/results.json \\
        --metrics seed0=runs/smollm2-seed0/metrics.jsonl seed1=runs/smollm2-seed1/metrics.jsonl

Reading is pure (and tested); drawing needs matplotlib, an optional extra (`pip install matplotlib`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from memagent.evaluation.plot import plot_by_method, pyplot, save_figure
from memagent.evaluation.tables import ResultRow


def read_result_rows(path: str | Path) -> list[ResultRow]:
    """The rows of an evaluate.py results.json."""
    rows = json.loads(Path(path).read_text())["rows"]
    return [ResultRow(**row) for row in rows]


def read_training_curve(path: str | Path, key: str = "rollout/accuracy") -> tuple[list[int], list[float]]:
    """(steps, values) of one metric from a train.py metrics.jsonl; steps without it (step 0, eval-only lines)
    are skipped, and a step logged twice (a resumed run) keeps its last value."""
    by_step: dict[int, float] = {}
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{number}: not a JSON line ({e.msg})") from e
        if key in record:
            by_step[int(record["step"])] = float(record[key])
    steps = sorted(by_step)
    return steps, [by_step[s] for s in steps]


def _labelled(pairs: list[str], flag: str) -> list[tuple[str, str]]:
    out = []
    for pair in pairs:
        label, sep, path = pair.partition("=")
        if not sep or not label or not path:
            raise SystemExit(f"error: {flag} {pair!r}: expected LABEL=PATH")
        out.append((label, path))
    return out


def draw(results: list[tuple[str, list[ResultRow]]], curves: list[tuple[str, tuple[list[int], list[float]]]],
         out: str | Path) -> Path:
    """Two panels: score vs length per (label, method); training accuracy (%) vs step per label."""
    plt = pyplot()
    fig, (acc, train) = plt.subplots(1, 2, figsize=(11, 4))
    for label, rows in results:
        plot_by_method(acc, rows, lambda r: r.score, label=f"{label}: ")
    acc.set(ylabel="held-out score (%)", title="accuracy vs length")
    for label, (steps, values) in curves:
        train.plot(steps, [100 * v for v in values], "-o", label=label)
    train.set(xlabel="RL step", ylabel="sampled training accuracy (%)", title="training rollouts")
    train.grid(alpha=0.3)
    for ax in (acc, train):
        ax.legend(fontsize=7)
    fig.tight_layout()
    return save_figure(fig, out)


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", nargs="*", default=[], help="LABEL=results.json of an evaluate.py run")
    parser.add_argument("--metrics", nargs="*", default=[], help="LABEL=metrics.jsonl of a train.py run")
    parser.add_argument("--key", default="rollout/accuracy", help="the metrics.jsonl field to plot against step")
    parser.add_argument("--out", required=True, help="PNG to write")
    args = parser.parse_args(argv)
    results = [(label, read_result_rows(path)) for label, path in _labelled(args.results, "--results")]
    curves = [(label, read_training_curve(path, args.key)) for label, path in _labelled(args.metrics, "--metrics")]
    path = draw(results, curves, args.out)
    print(f"wrote {path}")
    return path


if __name__ == "__main__":
    main()
