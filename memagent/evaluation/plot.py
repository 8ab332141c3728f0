"""Optional figure: accuracy and wall time per sample versus document length, one line per method and task.

matplotlib is an optional extra (`pip install matplotlib`, or `.[plot]`); without it `plot_results` raises a
clear error and evaluate.py reports it instead of crashing after a long run.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from memagent.evaluation.tables import ResultRow


def plot_results(rows: list[ResultRow], out: str | Path) -> Path:
    """Write a two-panel PNG (score, seconds per sample; log-2 length axis) and return its path."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # no display on servers and CI
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise RuntimeError("--plot needs matplotlib: pip install matplotlib (or .[plot])") from e
    lines: dict[tuple[str, str], list[ResultRow]] = defaultdict(list)
    for r in rows:
        lines[(r.method, r.source)].append(r)
    fig, (acc, wall) = plt.subplots(1, 2, figsize=(11, 4))
    for (method, source), group in sorted(lines.items()):
        group.sort(key=lambda r: r.length)
        lengths = [r.length for r in group]
        style = "-o" if method == "memagent" else "--s"
        acc.plot(lengths, [r.score for r in group], style, label=f"{method} / {source}")
        wall.plot(lengths, [r.seconds_per_sample for r in group], style, label=f"{method} / {source}")
    for ax, ylabel in ((acc, "score (%)"), (wall, "seconds per sample")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("document tokens")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    acc.legend(fontsize=7)
    fig.tight_layout()
    path = Path(out)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
