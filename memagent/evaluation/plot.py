"""Optional figure: accuracy and wall time per sample versus document length, one line per method and task.

matplotlib is an optional extra (`pip install matplotlib`, or `.[plot]`); without it `plot_results` raises a
clear error and evaluate.py reports it instead of crashing after a long run.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

from memagent.evaluation.tables import ResultRow


def pyplot():
    """matplotlib.pyplot on the Agg backend (no display on servers and CI), or a clear error without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise RuntimeError("plotting needs matplotlib: pip install matplotlib (or .[plot])") from e
    return plt


def save_figure(fig, out: str | Path) -> Path:
    """Write `fig` as a 120-dpi PNG at `out` (creating its folder), close it, and return the path."""
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    pyplot().close(fig)
    return path


def plot_by_method(ax, rows: list[ResultRow], value: Callable[[ResultRow], float], label: str = "") -> None:
    """One line per (method, source) of `rows` against document length on a log-2 axis; MemAgent solid."""
    lines: dict[tuple[str, str], list[ResultRow]] = defaultdict(list)
    for r in rows:
        lines[(r.method, r.source)].append(r)
    for (method, source), group in sorted(lines.items()):
        group.sort(key=lambda r: r.length)
        style = "-o" if method == "memagent" else "--s"
        ax.plot([r.length for r in group], [value(r) for r in group], style,
                label=f"{label}{method} / {source}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("document tokens")
    ax.grid(alpha=0.3)


def plot_results(rows: list[ResultRow], out: str | Path) -> Path:
    """Write a two-panel PNG (score, seconds per sample; log-2 length axis) and return its path."""
    plt = pyplot()
    fig, (acc, wall) = plt.subplots(1, 2, figsize=(11, 4))
    plot_by_method(acc, rows, lambda r: r.score)
    plot_by_method(wall, rows, lambda r: r.seconds_per_sample)
    acc.set_ylabel("score (%)")
    wall.set_ylabel("seconds per sample")
    acc.legend(fontsize=7)
    fig.tight_layout()
    return save_figure(fig, out)
