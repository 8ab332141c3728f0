"""The figure of MemAgent's evaluation in small (issue 24; docs/evaluation.md): accuracy against document length on
a log axis, one panel per task (training tasks on the top row, held-out ones below), with the untrained model, the
full-context baseline and the RL mean over the seeds, its error bars the sample standard deviation over them.

Drawing needs matplotlib, an optional extra (`pip install matplotlib`); the scores come from mix_scores.py.
"""

from __future__ import annotations

from pathlib import Path

from memagent.evaluation.mix_scores import (
    BASELINE,
    MIX_LAYOUT,
    UNTRAINED,
    MixLayout,
    MixRow,
    MixScores,
    seed_spread,
)
from memagent.evaluation.plot import pyplot, save_figure


def _plot_row(ax, scores: MixScores, row: MixRow, task: str, lengths: tuple[int, ...], style: str) -> None:
    found = [(n, cell.score) for n in lengths if (cell := scores.cell(row, task, n)) is not None]
    if found:
        ax.plot([n for n, _ in found], [s for _, s in found], style, label=row.label)


def _plot_seed_mean(ax, scores: MixScores, task: str, lengths: tuple[int, ...], layout: MixLayout) -> None:
    found = [(n, spread) for n in lengths if (spread := seed_spread(scores, task, n, layout)) is not None]
    if found:
        ax.errorbar([n for n, _ in found], [s.mean for _, s in found], yerr=[s.std or 0.0 for _, s in found],
                    fmt="-o", capsize=3, color="tab:red", label="RL mean ± std over seeds")


def draw_mix_figure(scores: MixScores, out: str | Path, layout: MixLayout = MIX_LAYOUT) -> Path:
    """Write the PNG (score in percent against document tokens, log-2 axis) to `out` and return its path."""
    plt = pyplot()
    panels = [(task, layout.train_lengths, "") for task in layout.train_tasks]
    heldout = [(task, layout.heldout_lengths, " (held-out)") for task in layout.heldout_tasks]
    columns = max(len(panels), len(heldout), 1)
    fig, axes = plt.subplots(2, columns, figsize=(3.2 * columns, 6.4), squeeze=False)
    for row_axes, row_panels in ((axes[0], panels), (axes[1], heldout)):
        for ax in row_axes[len(row_panels):]:
            ax.set_visible(False)
        for ax, (task, lengths, suffix) in zip(row_axes, row_panels):
            _plot_row(ax, scores, UNTRAINED, task, lengths, "-s")
            _plot_row(ax, scores, BASELINE, task, lengths, "--^")
            _plot_seed_mean(ax, scores, task, lengths, layout)
            if layout.window < max(lengths):  # the baseline truncates beyond this line
                ax.axvline(layout.window, color="grey", linestyle=":", linewidth=1,
                           label=f"the full-context {layout.window}-token window")
            ax.set_xscale("log", base=2)
            ax.set_xticks(lengths, [f"{n}\n{layout.times(n)}" for n in lengths])
            ax.minorticks_off()
            ax.set_ylim(-3, 103)
            ax.set_title(task + suffix, fontsize=9)
            ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("score (%)")
    axes[1][0].set_ylabel("score (%)")
    legend = {}  # label -> handle, from whichever panels have data
    for ax in axes.flat:
        legend.update(zip(*reversed(ax.get_legend_handles_labels())))
    fig.legend(list(legend.values()), list(legend), loc="lower center", ncol=4, fontsize=8)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    return save_figure(fig, out)
