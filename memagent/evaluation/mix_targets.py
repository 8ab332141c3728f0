"""Issue 24's targets for MemAgent's evaluation in small, checked on the mean over the RL seeds
(memagent/evaluation/mix_scores.py; scores in percent):

(a) at least +10 points over the untrained model in every training-task cell;
(b) at 64x the training length, at least 80% of the same model's 1x accuracy, on every training task;
(c) above the middle-truncated full-context baseline on every training task beyond its window (length > window);
(d) on the held-out tasks, at least +5 points over the untrained model on average over their cells.

(a)-(c) ask every cell to pass, so one measured cell that fails misses the target even while others are still
running; otherwise a cell without scores leaves it "not measured yet". (d) is an average and waits for every
cell. A verdict that rests on a cell with fewer than the target number of questions, or on a mean that lacks a
seed, is provisional.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from enum import Enum

from memagent.evaluation.mix_scores import (
    BASELINE,
    MIX_LAYOUT,
    UNTRAINED,
    MixLayout,
    MixRow,
    MixScores,
    seed_spread,
)

SCORE_TOLERANCE = 1e-9
"""Points: a seed mean on a bar up to float rounding is on it ((0 + 57 + 0) / 3 - 9 falls 4e-15 short of 10)."""


class Status(Enum):
    """Where a target stands."""

    MET = "met"
    MISSED = "missed"
    NOT_MEASURED = "not measured yet"


@dataclass(frozen=True)
class TargetCheck:
    """One target's verdict and the cells that decided it."""

    name: str
    """"(a)" to "(d)"."""
    target: str
    """What it asks, in words."""
    status: Status
    detail: str
    """The failing cells, or the closest one, and how many cells are not measured yet."""
    partial_cells: bool
    """A cell it rests on has fewer questions than the target n (a run still going, or stopped)."""
    missing_seeds: bool
    """A seed mean it rests on lacks a seed (that seed's cell is not evaluated yet)."""

    @property
    def provisional(self) -> bool:
        """The verdict may change as the missing questions or seeds come in."""
        return self.partial_cells or self.missing_seeds


@dataclass(frozen=True)
class _CellTest:
    where: str
    """"niah_single_1 64x"."""
    margin: float | None
    """Points above the bar (negative: below); None while a score it needs is missing."""
    text: str
    partial: bool
    missing_seeds: bool


def _verdict(name: str, target: str, tests: list[_CellTest], strict: bool, unit: str = "cells") -> TargetCheck:
    """Every test must pass: margin >= 0, or > 0 when `strict` (up to SCORE_TOLERANCE)."""
    measured = [t for t in tests if t.margin is not None]
    failed = [t for t in measured if (t.margin <= SCORE_TOLERANCE if strict else t.margin < -SCORE_TOLERANCE)]
    missing = len(tests) - len(measured)
    details = []
    if failed:
        status = Status.MISSED
        details.append("fails at " + "; ".join(f"{t.where} ({t.text})" for t in failed))
    else:
        status = Status.NOT_MEASURED if missing else Status.MET
        if measured:
            closest = min(measured, key=lambda t: t.margin)
            details.append(f"closest: {closest.where} ({closest.text})")
    if missing:
        details.append(f"{missing} of {len(tests)} {unit} not measured yet")
    return TargetCheck(name, target, status, "; ".join(details), any(t.partial for t in measured),
                       any(t.missing_seeds for t in measured))


def _against_row(scores: MixScores, layout: MixLayout, task: str, length: int, row: MixRow,
                 points: float) -> _CellTest:
    """The RL mean against `row`'s score + `points` in one cell."""
    rl, other = seed_spread(scores, task, length, layout), scores.cell(row, task, length)
    where = f"{task} {layout.times(length)}"
    if rl is None or other is None:
        return _CellTest(where, None, "", False, False)
    gap = rl.mean - other.score
    return _CellTest(where, gap - points, f"{rl.mean:.1f} vs {row.name} {other.score:.1f}: {gap:+.1f}",
                     min(*rl.ns, other.n) < layout.target_n, len(rl.seeds) < len(layout.seeds))


def check_gain_over_untrained(scores: MixScores, layout: MixLayout = MIX_LAYOUT) -> TargetCheck:
    """(a): RL mean - untrained >= 10 points in every (training task, training-task length) cell."""
    tests = [_against_row(scores, layout, task, length, UNTRAINED, 10.0)
             for task in layout.train_tasks for length in layout.train_lengths]
    return _verdict("(a)", "at least +10 points over untrained in every training-task cell", tests, strict=False)


def check_length_retention(scores: MixScores, layout: MixLayout = MIX_LAYOUT) -> TargetCheck:
    """(b): RL mean at the longest training-task length >= 0.8 x RL mean at the shortest, per training task."""
    short, long = layout.train_lengths[0], layout.train_lengths[-1]
    tests = []
    for task in layout.train_tasks:
        at_short, at_long = seed_spread(scores, task, short, layout), seed_spread(scores, task, long, layout)
        if at_short is None or at_long is None:
            tests.append(_CellTest(task, None, "", False, False))
            continue
        bar = 0.8 * at_short.mean
        tests.append(_CellTest(task, at_long.mean - bar,
                               f"{layout.times(long)} {at_long.mean:.1f} vs 80% of {layout.times(short)} "
                               f"{at_short.mean:.1f} = {bar:.1f}",
                               min(*at_short.ns, *at_long.ns) < layout.target_n,
                               min(len(at_short.seeds), len(at_long.seeds)) < len(layout.seeds)))
    return _verdict("(b)", f"at {layout.times(long)}, at least 80% of the same model's {layout.times(short)} "
                    "accuracy on every training task", tests, strict=False, unit="tasks")


def check_beyond_window(scores: MixScores, layout: MixLayout = MIX_LAYOUT) -> TargetCheck:
    """(c): RL mean > full-context baseline on every training task at every length above the baseline's window."""
    tests = [_against_row(scores, layout, task, length, BASELINE, 0.0)
             for task in layout.train_tasks for length in layout.train_lengths if length > layout.window]
    return _verdict("(c)", f"above the truncated full-context baseline on every training task beyond its "
                    f"{layout.window}-token window", tests, strict=True)


def check_heldout_gain(scores: MixScores, layout: MixLayout = MIX_LAYOUT) -> TargetCheck:
    """(d): mean over the held-out (task, length) cells of (RL mean - untrained) >= 5 points."""
    tests = [_against_row(scores, layout, task, length, UNTRAINED, 0.0)
             for task in layout.heldout_tasks for length in layout.heldout_lengths]
    measured = [t for t in tests if t.margin is not None]
    mean_gain = statistics.fmean(t.margin for t in measured) if measured else None
    details = [f"mean gain {mean_gain:+.1f} over {len(measured)} of {len(tests)} cells"] if measured else []
    if mean_gain is None or len(measured) < len(tests):
        status = Status.NOT_MEASURED
        details.append(f"{len(tests) - len(measured)} of {len(tests)} cells not measured yet")
    else:
        status = Status.MET if mean_gain >= 5.0 - SCORE_TOLERANCE else Status.MISSED
    return TargetCheck("(d)", "held-out tasks: at least +5 points over untrained on average", status, "; ".join(details),
                       any(t.partial for t in measured), any(t.missing_seeds for t in measured))


def check_targets(scores: MixScores, layout: MixLayout = MIX_LAYOUT) -> list[TargetCheck]:
    """The four checks, (a) to (d)."""
    return [check(scores, layout) for check in
            (check_gain_over_untrained, check_length_retention, check_beyond_window, check_heldout_gain)]
