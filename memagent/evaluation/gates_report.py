"""Gated against ungated memory on the task-mix grid (issue 25; docs/gates.md): for every training task and length, the
RL mean accuracy of the ungated seeds (`seed0`..`seed2`) and the gated ones (`gates-seed0`..`gates-seed2`, evaluated
with `--gates both`), what each pays per correct answer, the gated policy's decisions and reading, and the issue's
target check; optionally a figure of generated tokens per correct answer against accuracy.

    python -m memagent.evaluation.gates_report --eval-dir runs/mix-eval --markdown runs/mix-eval/gates-report.md \\
        --figure docs/figures/smollm2_gates.png

Cells are read as mix_report reads them (mix_scores.py; a cut-off run counts with its n); only --markdown and --figure
are written.
"""

from __future__ import annotations

import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from memagent.evaluation.mix_report import (
    MISSING,
    arithmetic_markdown,
    parse_report_args,
    report_parser,
    run_report,
    spread_text,
    write_markdown,
)
from memagent.evaluation.mix_scores import (
    PRESET_SEED_ROWS,
    SEED_ROWS,
    MixLayout,
    MixRow,
    MixScores,
    SeedSpread,
    read_mix_scores,
    seed_rows,
    seed_spread,
)
from memagent.evaluation.mix_targets import SCORE_TOLERANCE, Status
from memagent.evaluation.plot import pyplot, save_figure
from memagent.evaluation.tables import markdown_table


def gated_rows(prefix: str = "gates") -> tuple[MixRow, ...]:
    """The gated seeds' rows `{prefix}-seed0`..`{prefix}-seed2`: `gates` for the smollm2-mix-gates preset, `gates-cost`
    for smollm2-mix-gates-cost (the Makefile's GATES_ROW)."""
    name = "gated" if prefix == "gates" else f"gated ({prefix})"
    return seed_rows(f"{prefix}-", f"{name} seed")


GATED_ROWS = gated_rows()
UNGATED, GATED = MixLayout(seeds=SEED_ROWS), MixLayout(seeds=GATED_ROWS)
"""The ungated and the (default) gated RL seeds on issue 24's grid."""
TARGET_RATIO, TARGET_DROP, TARGET_LENGTHS = 2.0, 2.0, (8192, 32768)
"""The target: token ratio >= 2 and accuracy >= ungated - 2 points, at 16x and 64x the training length."""


@dataclass(frozen=True)
class ModelSummary:
    """One model (ungated or gated) in one cell, over the seeds that have it."""

    accuracy: SeedSpread
    tokens_per_correct: float | None
    """Generated tokens over correct answers, pooled over the seeds' questions; inf when none was correct, None when
    a seed did not record its tokens."""
    chunks_read_share: float | None
    """Chunks read over chunks in the document, mean over the seeds (None: not recorded)."""
    keep_share: float | None
    update_share: float | None
    answer_share: float | None
    """The decision shares (UPDATE includes unparsed ones), mean over the seeds (None without gates)."""
    wall_s: float
    """Wall seconds per question, mean over the seeds."""


def _mean(values: list[float | None]) -> float | None:
    return None if None in values else statistics.fmean(values)


def summarise(scores: MixScores, task: str, length: int, layout: MixLayout) -> ModelSummary | None:
    """The layout's seeds in one cell, or None when no seed has it."""
    spread = seed_spread(scores, task, length, layout)
    if spread is None:
        return None
    cells = [cell for row in layout.seeds if (cell := scores.cell(row, task, length)) is not None]
    correct = sum(c.score / 100.0 * c.n for c in cells)
    tokens = None if any(c.generated_tokens is None for c in cells) else (
        sum(c.generated_tokens * c.n for c in cells) / correct if correct > 0 else math.inf)
    return ModelSummary(
        accuracy=spread, tokens_per_correct=tokens,
        chunks_read_share=_mean([None if c.chunks_read is None else c.chunks_read / c.chunks for c in cells]),
        keep_share=_mean([c.keep_share for c in cells]), update_share=_mean([c.update_share for c in cells]),
        answer_share=_mean([c.answer_share for c in cells]),
        wall_s=statistics.fmean(c.seconds_per_sample for c in cells))


def token_ratio(ungated: float | None, gated: float | None) -> float | None:
    """Ungated over gated tokens per correct answer (inf when only the gated model answered any, 0 when only the
    ungated one did); None when either is unknown or neither answered any."""
    if ungated is None or gated is None or math.isinf(ungated) and math.isinf(gated):
        return None
    return 0.0 if math.isinf(gated) else ungated / gated


def _num(value: float | None, digits: int = 1, scale: float = 1.0, suffix: str = "") -> str:
    if value is None:
        return MISSING
    return "∞" if math.isinf(value) else f"{scale * value:.{digits}f}{suffix}"


def comparison_table(scores: MixScores, target_n: int, gated_seeds: tuple[MixRow, ...] = GATED_ROWS,
                     ungated_seeds: tuple[MixRow, ...] = SEED_ROWS) -> str:
    """Markdown: a row per training task and length, ungated against gated."""
    ungated, gated = MixLayout(seeds=ungated_seeds, target_n=target_n), MixLayout(seeds=gated_seeds, target_n=target_n)
    header = ["task", "tokens (x train)", "ungated RL", "gated RL", "Δ acc", "tok/correct ungated", "tok/correct gated",
              "ratio", "chunks read (gated)", "KEEP", "UPDATE", "ANSWER", "s/q ungated", "s/q gated"]
    lines = []
    for task in UNGATED.train_tasks:
        for length in UNGATED.train_lengths:
            u, g = summarise(scores, task, length, ungated), summarise(scores, task, length, gated)
            delta = None if u is None or g is None else g.accuracy.mean - u.accuracy.mean
            u_tokens, g_tokens = u and u.tokens_per_correct, g and g.tokens_per_correct
            lines.append([
                task, f"{length} ({UNGATED.times(length)})", spread_text(u and u.accuracy, ungated),
                spread_text(g and g.accuracy, gated), MISSING if delta is None else f"{delta:+.1f}",
                _num(u_tokens, 0), _num(g_tokens, 0), _num(token_ratio(u_tokens, g_tokens), 2, suffix="x"),
                *(_num(share, 0, 100.0, "%") for share in ((g.chunks_read_share, g.keep_share, g.update_share,
                                                             g.answer_share) if g else (None,) * 4)),
                _num(u and u.wall_s, 2), _num(g and g.wall_s, 2)])
    return markdown_table(header, lines)


@dataclass(frozen=True)
class CellVerdict:
    """The target on one (task, length) cell."""

    task: str
    length: int
    status: Status
    detail: str
    """Ratio, accuracy change and the seed counts behind them (or which model is measured)."""
    provisional: bool
    """A seed is missing or a cell has fewer than the target questions."""


def check_cell(scores: MixScores, task: str, length: int, target_n: int,
               gated_seeds: tuple[MixRow, ...] = GATED_ROWS, ungated_seeds: tuple[MixRow, ...] = SEED_ROWS) -> CellVerdict:
    """Met at >= 2x fewer tokens per correct answer and accuracy no more than 2 points below ungated (both bounds
    inclusive, up to float rounding); not measured while either model lacks the cell or its token counts."""
    u, g = (summarise(scores, task, length, MixLayout(seeds=ungated_seeds)),
            summarise(scores, task, length, MixLayout(seeds=gated_seeds)))
    if u is None or g is None or None in (u.tokens_per_correct, g.tokens_per_correct):
        have = [name for name, s in (("ungated", u), ("gated", g)) if s and s.tokens_per_correct is not None]
        return CellVerdict(task, length, Status.NOT_MEASURED, f"measured: {', '.join(have) or 'neither'}", False)
    ratio, delta = token_ratio(u.tokens_per_correct, g.tokens_per_correct), g.accuracy.mean - u.accuracy.mean
    met = (ratio is not None and ratio >= TARGET_RATIO * (1 - SCORE_TOLERANCE)
           and delta >= -TARGET_DROP - SCORE_TOLERANCE)
    detail = (f"ratio {_num(ratio, 2, suffix='x')}, Δ accuracy {delta:+.1f} points; "
              f"{len(u.accuracy.seeds)} ungated, {len(g.accuracy.seeds)} gated seeds")
    provisional = (len(u.accuracy.seeds) < len(ungated_seeds) or len(g.accuracy.seeds) < len(gated_seeds)
                   or min(*u.accuracy.ns, *g.accuracy.ns) < target_n)
    return CellVerdict(task, length, Status.MET if met else Status.MISSED, detail, provisional)


def overall(verdicts: list[CellVerdict]) -> Status:
    """Missed when a measured cell missed, met when every cell met, else not measured yet."""
    statuses = {v.status for v in verdicts}
    return (Status.MISSED if Status.MISSED in statuses
            else Status.MET if statuses == {Status.MET} else Status.NOT_MEASURED)


def target_markdown(scores: MixScores, target_n: int, gated_seeds: tuple[MixRow, ...] = GATED_ROWS,
                    ungated_seeds: tuple[MixRow, ...] = SEED_ROWS) -> str:
    """The target check: one bullet per cell at 16x and 64x, then the overall verdict."""
    verdicts = [check_cell(scores, task, length, target_n, gated_seeds, ungated_seeds)
                for task in UNGATED.train_tasks for length in TARGET_LENGTHS]
    lines = [f"### Target check: at 16x and 64x, at least {TARGET_RATIO:g}x fewer generated tokens per correct answer "
             f"at accuracy within {TARGET_DROP:g} points of the ungated model or better", ""]
    for v in verdicts:
        mark = " (provisional)" if v.provisional and v.status is not Status.NOT_MEASURED else ""
        lines.append(f"- {v.task} {UNGATED.times(v.length)}: **{v.status.value}{mark}** ({v.detail})")
    status = overall(verdicts)
    mark = " (provisional)" if status is not Status.NOT_MEASURED and any(v.provisional for v in verdicts) else ""
    lines += ["", f"**Overall: {status.value}{mark}** over {len(verdicts)} cells."]
    return "\n".join(lines)


def report_markdown(scores: MixScores, target_n: int = UNGATED.target_n,
                    gated_seeds: tuple[MixRow, ...] = GATED_ROWS, ungated_seeds: tuple[MixRow, ...] = SEED_ROWS) -> str:
    """The whole report: caption, table, target check."""
    caption = (
        f"Accuracy in percent, mean ± sample std over the RL seeds that have the cell (a cell that lacks a seed says "
        f"how many; n≥k: a seed's cell has fewer than {target_n} questions; {MISSING}: not evaluated yet). Δ acc: "
        f"gated minus ungated, points. tok/correct: generated tokens (every conversation) over correct answers, "
        f"pooled over the seeds' questions (∞: none correct); ratio: ungated over gated. Chunks read: share of the "
        f"document's chunks the gated policy read before answering. KEEP/UPDATE/ANSWER: shares of the gated "
        f"decisions (UPDATE includes unparsed). s/q: wall seconds per question. Shares and seconds: mean over seeds.")
    title = f"## {gated_seeds[0].label.removesuffix(' seed 0').capitalize()} against ungated memory: SmolLM2-135M-Instruct"
    parts = [title, comparison_table(scores, target_n, gated_seeds, ungated_seeds), caption]
    if arithmetic := arithmetic_markdown(scores, MixLayout(seeds=(*ungated_seeds, *gated_seeds))):
        parts.append(arithmetic)
    return "\n\n".join([*parts, target_markdown(scores, target_n, gated_seeds, ungated_seeds)]) + "\n"


def draw_gates_figure(scores: MixScores, out: str | Path, gated_seeds: tuple[MixRow, ...] = GATED_ROWS,
                      ungated_seeds: tuple[MixRow, ...] = SEED_ROWS) -> Path:
    """PNG: generated tokens per correct answer (log) against accuracy, one panel per training task, one point per
    (length, model), an arrow from ungated to gated at each length."""
    plt = pyplot()
    columns = len(UNGATED.train_tasks)
    fig, axes = plt.subplots(1, columns, figsize=(3.6 * columns, 3.6), squeeze=False)
    colors = dict(zip(UNGATED.train_lengths, ("tab:blue", "tab:orange", "tab:green", "tab:red")))
    for ax, task in zip(axes[0], UNGATED.train_tasks):
        for length in UNGATED.train_lengths:
            points = {}
            for name, layout, marker in (("ungated", MixLayout(seeds=ungated_seeds), "o"),
                                         ("gated", MixLayout(seeds=gated_seeds), "^")):
                s = summarise(scores, task, length, layout)
                if s is not None and s.tokens_per_correct is not None and math.isfinite(s.tokens_per_correct):
                    points[name] = (s.accuracy.mean, s.tokens_per_correct)
                    ax.plot(*points[name], marker, color=colors.get(length), label=f"{name} {UNGATED.times(length)}")
            if len(points) == 2:
                ax.annotate("", xy=points["gated"], xytext=points["ungated"],
                            arrowprops={"arrowstyle": "->", "color": colors.get(length), "alpha": 0.6})
        ax.set(yscale="log", xlim=(-3, 103), xlabel="accuracy (%)", title=task)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("generated tokens per correct answer")
    legend = {label: handle for ax in axes.flat for handle, label in zip(*ax.get_legend_handles_labels())}
    fig.legend(list(legend.values()), list(legend), loc="lower center", ncol=8, fontsize=7)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    return save_figure(fig, out)


def main(argv: list[str] | None = None) -> str:
    """Parse the command line, write the markdown (to --markdown or stdout) and the figure; returns the markdown."""
    parser = report_parser(__doc__.split("\n\n")[0], "tokens per correct answer against accuracy", UNGATED.target_n)
    parser.add_argument("--gated-rows", default="gates",
                        help="row prefix of the gated seeds: gates (default), gates-cost (the read-cost preset) or "
                             "lora-gates-cost (its LoRA variant)")
    parser.add_argument("--ungated-preset", choices=list(PRESET_SEED_ROWS), default="smollm2-mix",
                        help="the ungated seeds compared against: smollm2-mix's, or smollm2-mix-lora's (rows lora-seedN)")
    args = parse_report_args(parser, argv)
    gated_seeds, ungated_seeds = gated_rows(args.gated_rows), PRESET_SEED_ROWS[args.ungated_preset]
    scores = read_mix_scores(args.eval_dir, MixLayout(seeds=(*ungated_seeds, *gated_seeds)))
    text = report_markdown(scores, args.target_n, gated_seeds, ungated_seeds)
    write_markdown(text, args.markdown)
    if args.figure:
        print(f"wrote {draw_gates_figure(scores, args.figure, gated_seeds, ungated_seeds)}", file=sys.stderr)
    return text


def cli(argv: list[str] | None = None) -> None:
    """The report's command line (main) with one-line errors (mix_report.run_report)."""
    run_report(main, argv)


if __name__ == "__main__":
    cli()
