"""The report of MemAgent's evaluation in small (issue 24, preset smollm2-mix; docs/evaluation.md): the score
tables of MemAgent's main results (arXiv 2507.02259) turned on their side (a row per task and length, a column per
model, the RL mean over the seeds and its gain over the untrained model), the target check under them, each seed's
training curve by step, and optionally the accuracy-vs-length figure (memagent/evaluation/mix_figure.py).
`--preset smollm2-mix-lora` reports the LoRA grid instead: its seed rows are lora-seed0..2.

    python -m memagent.evaluation.mix_report --eval-dir runs/mix-eval \\
        --runs runs/smollm2-mix-seed0 runs/smollm2-mix-seed1 runs/smollm2-mix-seed2 \\
        --figure docs/figures/smollm2_mix.png --markdown runs/mix-eval/report.md

Reads whatever cells exist (a run stopped part way counts with its n); it never writes under the eval or run dirs
except the --markdown and --figure paths it is given.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from memagent.evaluation.figures import read_training_curve
from memagent.evaluation.hedging import HedgeCounts, count_hedging, hedging_markdown
from memagent.evaluation.memory_errors import FateCounts, count_fates, fates_markdown
from memagent.evaluation.mix_figure import draw_mix_figure
from memagent.evaluation.mix_ledger import read_ledger, updated_ledger, with_ledger, write_ledger
from memagent.evaluation.mix_scores import (
    MIX_LAYOUT,
    PRESET_SEED_ROWS,
    UNRECORDED,
    MixLayout,
    MixScores,
    RowAverage,
    SeedSpread,
    read_mix_scores,
    read_traces,
    rl_gain,
    row_average,
    seed_average_spread,
    seed_spread,
)
from memagent.evaluation.mix_targets import TargetCheck, check_targets
from memagent.evaluation.plot import pyplot
from memagent.evaluation.tables import ResultRow, markdown_table

MISSING = "—"
"""A cell with no scored question yet."""


def cell_text(cell: ResultRow | None, target_n: int) -> str:
    """"62.5", "62.5 (n=12)" when the cell has fewer than target_n questions, or "—" when it has none."""
    if cell is None:
        return MISSING
    return f"{cell.score:.1f}" if cell.n >= target_n else f"{cell.score:.1f} (n={cell.n})"


def spread_text(spread: SeedSpread | None, layout: MixLayout = MIX_LAYOUT) -> str:
    """"71.2 ± 4.1" (mean ± sample std over the seeds), with "(2 seeds)" / "(1 seed)" when not every seed has
    it and "n≥12" when a seed's cell is partial; "—" when no seed has it."""
    if spread is None:
        return MISSING
    text = f"{spread.mean:.1f}" if spread.std is None else f"{spread.mean:.1f} ± {spread.std:.1f}"
    notes = []
    if len(spread.seeds) < len(layout.seeds):
        notes.append(f"{len(spread.seeds)} seed{'s' if len(spread.seeds) > 1 else ''}")
    if min(spread.ns) < layout.target_n:
        notes.append(f"n≥{min(spread.ns)}")
    return text + (f" ({', '.join(notes)})" if notes else "")


def average_text(average: RowAverage | None, target_n: int) -> str:
    """"62.5", "62.5 (n≥12)" when one of its cells has fewer than target_n questions, or "—" when it has none."""
    if average is None:
        return MISSING
    return f"{average.score:.1f}" if average.fewest_n >= target_n else f"{average.score:.1f} (n≥{average.fewest_n})"


def gain_text(gain: float | None) -> str:
    """"+12.5" points, or "—" when there is none."""
    return MISSING if gain is None else f"{gain:+.1f}"


def score_table(scores: MixScores, tasks: tuple[str, ...], lengths: tuple[int, ...],
                layout: MixLayout = MIX_LAYOUT) -> str:
    """Markdown: a row per (task, length) and a last row of averages; a column per model, then the RL mean ±
    spread and its gain over the untrained model."""
    cells = [(task, length) for task in tasks for length in lengths]
    header = ["task", "tokens (x train)", *(row.label for row in layout.rows), "RL mean ± std", "RL − untrained"]
    lines = [[task, f"{length} ({layout.times(length)})",
              *(cell_text(scores.cell(row, task, length), layout.target_n) for row in layout.rows),
              spread_text(seed_spread(scores, task, length, layout), layout),
              gain_text(rl_gain(scores, task, length, layout))] for task, length in cells]
    gains = [rl_gain(scores, task, length, layout) for task, length in cells]
    mean_gain = statistics.fmean(gains) if cells and None not in gains else None
    lines.append(["average", "", *(average_text(row_average(scores, row, cells), layout.target_n)
                                   for row in layout.rows),
                  spread_text(seed_average_spread(scores, cells, layout), layout), gain_text(mean_gain)])
    return markdown_table(header, lines)


def tables_markdown(scores: MixScores, layout: MixLayout = MIX_LAYOUT) -> str:
    """Both score tables with their captions."""
    caption = (
        f"Score in percent (the primary metric x 100, docs/evaluation.md) on the same questions in every column. "
        f"Tokens: document tokens, in brackets as a multiple of the {layout.training_length}-token training "
        f"length. A cell with fewer than {layout.target_n} questions shows its n; {MISSING}: not evaluated yet. "
        f"The full-context baseline reads each document middle-truncated to its {layout.window}-token window. "
        f"RL mean ± std: the mean over the seeds that have the cell ± the sample standard deviation over them "
        f"(n - 1); a cell that not every seed has says how many (one seed: its value, no spread). RL − untrained: "
        f"the RL mean minus the untrained score, in points, where both exist. Average: over the column's cells, "
        f"only when it has all of them (for the RL mean, over the seeds that have all).")
    return "\n\n".join([
        "### Training tasks", score_table(scores, layout.train_tasks, layout.train_lengths, layout),
        "### Held-out tasks (never trained on)",
        score_table(scores, layout.heldout_tasks, layout.heldout_lengths, layout), caption])


def arithmetic_markdown(scores: MixScores, layout: MixLayout = MIX_LAYOUT) -> str:
    """Which dtype each row's cells were scored in (their run_config.json), flagged when the cells mix dtypes:
    `--dtype auto` is bfloat16 on a machine with native bf16 and float32 elsewhere, and greedy decoding parts ways
    between the two (docs/evaluation.md), so a gain read across dtypes mixes the model's change with the
    arithmetic's."""
    parts = []
    for row in layout.rows:
        by_dtype: dict[str, list[int]] = {}
        for (name, length), dtype in sorted(scores.dtypes.items(), key=lambda item: item[0][1]):
            if name == row.name:
                by_dtype.setdefault(dtype, []).append(length)
        if by_dtype:
            listed = ", ".join(f"{dtype} ({', '.join(layout.times(n) for n in lengths)})"
                               for dtype, lengths in by_dtype.items())
            parts.append(f"{row.label}: {listed}")
    if not parts:
        return ""
    text = "Weights' dtype of each row's cells (their run_config.json): " + "; ".join(parts) + "."
    recorded = sorted(set(scores.dtypes.values()) - {UNRECORDED})
    if len(recorded) > 1:
        text += (f" **The cells were scored in more than one dtype ({', '.join(recorded)})**: greedy decoding of "
                 f"the same weights parts ways between them, so compare rows within one dtype.")
    for row in layout.rows:
        fingerprints = sorted({w for (name, _, _), w in scores.weights.items() if name == row.name})
        if len(fingerprints) > 1:
            text += (f" **{row.label}'s cells come from more than one set of weights ({', '.join(fingerprints)})**: "
                     f"a model trained again is another model, so the row mixes models.")
    return text


def targets_markdown(checks: list[TargetCheck]) -> str:
    """One bullet per target: verdict, what it asks, and the cells that decided it."""
    lines = ["### Target check (on the RL mean over the seeds)", ""]
    for check in checks:
        reasons = [why for why, flag in (("partial cells", check.partial_cells),
                                         ("not every seed", check.missing_seeds)) if flag]
        verdict = check.status.value + (f" (provisional: {', '.join(reasons)})" if reasons else "")
        lines.append(f"- **{check.name} {verdict}**: {check.target} ({check.detail}).")
    return "\n".join(lines)


@dataclass(frozen=True)
class CurveColumn:
    """One metrics.jsonl field by RL step, in the unit the report shows."""

    label: str
    by_step: dict[int, float]


@dataclass(frozen=True)
class TrainingCurves:
    """A train.py run's sampled rollout metrics by step."""

    metrics: Path
    columns: tuple[CurveColumn, ...]
    """Only the fields the run logged."""
    temperature: float | None = None
    """The run's rollout temperature (its config.json), None when the run dir has no config.json."""


def read_curves(run_dir: str | Path, tasks: tuple[str, ...] = MIX_LAYOUT.train_tasks) -> TrainingCurves:
    """Accuracy (overall and per task, percent), mean memory and answer length (tokens) from run_dir/metrics.jsonl."""
    metrics = Path(run_dir) / "metrics.jsonl"
    if not metrics.is_file():
        raise ValueError(f"--runs {run_dir}: no metrics.jsonl in it")
    fields = [("accuracy %", "rollout/accuracy", 100.0),
              *((f"{task} %", f"rollout/accuracy/{task}", 100.0) for task in tasks),
              ("memory tokens", "rollout/memory_len", 1.0), ("answer tokens", "rollout/answer_len", 1.0)]
    columns = []
    for label, key, scale in fields:
        steps, values = read_training_curve(metrics, key)
        if steps:
            columns.append(CurveColumn(label, {s: scale * v for s, v in zip(steps, values)}))
    config = Path(run_dir) / "config.json"
    temperature = json.loads(config.read_text())["rollout"]["temperature"] if config.is_file() else None
    return TrainingCurves(metrics, tuple(columns), temperature)


def curves_markdown(curves: TrainingCurves) -> str:
    """A table with a row per logged step and a column per field."""
    title = f"### Training curve: {curves.metrics}"
    steps = sorted({step for column in curves.columns for step in column.by_step})
    if not steps:
        return f"{title}\n\nNo RL step logged yet."
    lines = [[str(step), *(f"{c.by_step[step]:.1f}" if step in c.by_step else MISSING for c in curves.columns)]
             for step in steps]
    sampled = "" if curves.temperature is None else f" at temperature {curves.temperature:g}"
    note = f"Sampled training rollouts{sampled} (the training verifier), refills included."
    return "\n\n".join([title, markdown_table(["step", *(c.label for c in curves.columns)], lines), note])


def read_fates(eval_dir: str | Path, layout: MixLayout = MIX_LAYOUT) -> list[FateCounts]:
    """Where the golds of the training tasks went (memagent.evaluation.memory_errors) in every MemAgent row's cell
    under eval_dir, labelled "{row label}, {length}x"; cells not evaluated yet are left out."""
    cells = []
    for length in layout.train_lengths:
        for row in layout.rows:
            traces = Path(eval_dir) / f"{row.name}-{length}" / "traces.jsonl"
            if row.method != "memagent" or not traces.is_file():  # the baseline keeps no memory
                continue
            label = f"{row.label}, {layout.times(length)}"
            cells += [c for c in count_fates(label, read_traces(traces)) if c.task in layout.train_tasks]
    return cells


def read_hedging(eval_dir: str | Path, layout: MixLayout = MIX_LAYOUT) -> list[HedgeCounts]:
    """Hedged answers (memagent.evaluation.hedging) in every row's cell under eval_dir, the full-context baseline's
    too, labelled "{row label}, {length}x", for the tasks whose golds have a shape; cells not evaluated yet are left
    out."""
    cells = []
    for length in sorted({*layout.train_lengths, *layout.heldout_lengths}):
        for row in layout.rows:
            traces = Path(eval_dir) / f"{row.name}-{length}" / "traces.jsonl"
            if traces.is_file():
                cells += count_hedging(f"{row.label}, {layout.times(length)}", read_traces(traces), row.method)
    return cells


def report_markdown(scores: MixScores, curves: list[TrainingCurves], layout: MixLayout = MIX_LAYOUT,
                    fates: list[FateCounts] | None = None, hedging: list[HedgeCounts] | None = None) -> str:
    """The whole report: tables, target check, where the golds went, hedged answers, training curves."""
    parts = [f"## MemAgent's evaluation in small: SmolLM2-135M-Instruct, {layout.preset}", tables_markdown(scores, layout)]
    if arithmetic := arithmetic_markdown(scores, layout):
        parts.append(arithmetic)
    parts.append(targets_markdown(check_targets(scores, layout)))
    if fates:
        parts += ["### Where the golds went (training tasks, percent of golds; docs/evaluation.md)",
                  fates_markdown(fates)]
    if hedging:
        parts += ["### Answers that name other values beside the golds (memagent.evaluation.hedging)",
                  hedging_markdown(hedging)]
    parts += [curves_markdown(c) for c in curves]
    return "\n\n".join(parts) + "\n"


def report_parser(description: str, figure: str, target_n: int) -> argparse.ArgumentParser:
    """The options every report over an eval dir takes: --eval-dir, --markdown, --figure (`figure` says what it
    draws) and --target-n (default `target_n`); parse with `parse_report_args`."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--eval-dir", required=True, help="dir of {row}-{length} evaluate.py output dirs")
    parser.add_argument("--markdown", help="file to write the report to (default: stdout)")
    parser.add_argument("--figure", help=f"PNG of {figure} (needs matplotlib)")
    parser.add_argument("--target-n", type=int, default=target_n, help="questions in a finished cell")
    return parser


def parse_report_args(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """Parse a `report_parser` command line; refuse --target-n below 1, and a --figure without matplotlib before any
    file is read."""
    args = parser.parse_args(argv)
    if args.target_n < 1:
        parser.error(f"--target-n {args.target_n}: must be at least 1")
    if args.figure:
        try:
            pyplot()
        except RuntimeError as e:
            parser.error(f"--figure {args.figure}: {e}")
    return args


def main(argv: list[str] | None = None) -> str:
    """Parse the command line, write the markdown (to --markdown or stdout) and the figure; returns the markdown."""
    parser = report_parser(__doc__.split("\n\n")[0], "accuracy against length", MIX_LAYOUT.target_n)
    parser.add_argument("--runs", nargs="*", default=[], help="train.py output dirs (their metrics.jsonl)")
    parser.add_argument("--preset", choices=list(PRESET_SEED_ROWS), default=MIX_LAYOUT.preset,
                        help="the grid: its seed rows are this preset's (the Makefile's MIX_PRESET)")
    parser.add_argument("--ledger", help="JSON file of recorded cells, read beside the traces (docs/evaluation.md)")
    parser.add_argument("--update-ledger", action="store_true",
                        help="write the run cells with at least as many questions as recorded into --ledger")
    args = parse_report_args(parser, argv)
    if args.update_ledger and not args.ledger:
        parser.error("--update-ledger needs --ledger")
    layout = MixLayout(seeds=PRESET_SEED_ROWS[args.preset], preset=args.preset, target_n=args.target_n)
    # With a ledger the eval dir may not exist yet: a fresh clone redraws the recorded cells alone.
    no_runs = args.ledger and not Path(args.eval_dir).exists()
    scores = MixScores({}) if no_runs else read_mix_scores(args.eval_dir, layout)
    if args.ledger:
        ledger = read_ledger(args.ledger)
        if args.update_ledger:
            write_ledger(args.ledger, updated_ledger(ledger, scores, datetime.date.today().isoformat()))
            print(f"updated {args.ledger}", file=sys.stderr)
        scores = with_ledger(scores, ledger, layout)
    curves = []
    for run in args.runs:
        if not Path(run).is_dir():  # `ls -d runs/smollm2-mix-seed*` also lists the runs' .log files
            print(f"skipping --runs {run}: not a directory", file=sys.stderr)
            continue
        curves.append(read_curves(run, layout.train_tasks))
    text = report_markdown(scores, curves, layout, read_fates(args.eval_dir, layout),
                           read_hedging(args.eval_dir, layout))
    write_markdown(text, args.markdown)
    if args.figure:
        print(f"wrote {draw_mix_figure(scores, args.figure, layout)}", file=sys.stderr)
    return text


def write_markdown(text: str, path: str | None) -> None:
    """Write a report to `path` (creating its folder), or to stdout when no path is given."""
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text, encoding="utf-8")
        print(f"wrote {path}", file=sys.stderr)
    else:
        print(text, end="")


def run_report(main_of_report: Callable[[list[str] | None], str], argv: list[str] | None = None) -> None:
    """`main_of_report(argv)`, with a bad file or value (ValueError, OSError) reported as one `error:` line and exit
    status 2, as the other command lines do (docs/evaluation.md, "Errors from the command lines"). The reports are
    library modules run with `python -m`, so they keep to this subset of memagent.cli.run_cli, which sits above them."""
    try:
        main_of_report(argv)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


def cli(argv: list[str] | None = None) -> None:
    """The report's command line (main) with one-line errors (run_report)."""
    run_report(main, argv)


if __name__ == "__main__":
    cli()
