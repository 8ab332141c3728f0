"""Scores of MemAgent's evaluation in small (issue 24, preset smollm2-mix; docs/evaluation.md): read every
`{row}-{length}/traces.jsonl` under an eval dir into one ResultRow per (row, task, length) cell, and summarise the
RL seeds of a cell as a mean and a spread.

Cells come from traces.jsonl, not results.json (written only when a run finishes), so a run stopped part way still
counts, with its `n`. The files are only read: a cut-off last line (a run still writing, or killed) is skipped,
never repaired; repairing is the job of the evaluate.py run that owns the file (memagent/evaluation/traces.py).
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memagent.config.presets import MIX_HELDOUT_TASKS, MIX_TRAIN_TASKS
from memagent.evaluation.tables import ResultRow, aggregate


@dataclass(frozen=True)
class MixRow:
    """One row of the table: the evaluate.py output dirs `{name}-{length}` and the method read from them."""

    name: str
    """Directory prefix under the eval dir ("untrained", "baseline", "seed0", ...)."""
    label: str
    """What the table calls it."""
    method: str
    """The trace records' method: "memagent" or "full-context"."""




def seed_rows(prefix: str = "", label: str = "seed") -> tuple[MixRow, ...]:
    """The three RL seeds' rows: dirs `{prefix}seed0`..`{prefix}seed2` (the Makefile's row names), labelled
    "{label} 0".."{label} 2"."""
    return tuple(MixRow(f"{prefix}seed{i}", f"{label} {i}", "memagent") for i in range(3))


SEED_ROWS = seed_rows()
"""The smollm2-mix seeds (full fine-tuning)."""
LORA_SEED_ROWS = seed_rows("lora-", "LoRA seed")
"""The smollm2-mix-lora seeds, whose policies are adapter files (docs/evaluation.md, "A grid that outlives its
machine")."""
PRESET_SEED_ROWS = {"smollm2-mix": SEED_ROWS, "smollm2-mix-lora": LORA_SEED_ROWS}
"""The seed rows of each training preset's grid (`make smollm2-mix MIX_PRESET=...`)."""
UNTRAINED = MixRow("untrained", "untrained", "memagent")
BASELINE = MixRow("baseline", "full-context", "full-context")


@dataclass(frozen=True)
class MixLayout:
    """Which cells the evaluation has: tasks, lengths (document tokens) and rows."""

    train_tasks: tuple[str, ...] = MIX_TRAIN_TASKS
    heldout_tasks: tuple[str, ...] = MIX_HELDOUT_TASKS
    train_lengths: tuple[int, ...] = (512, 2048, 8192, 32768)
    """Training tasks at 1x, 4x, 16x and 64x the training length."""
    heldout_lengths: tuple[int, ...] = (512, 2048)
    training_length: int = 512
    """Document tokens of the training questions (the 1x of the column labels)."""
    window: int = 8192
    """The full-context baseline's window (SmolLM2's max_position_embeddings): longer documents are truncated."""
    seeds: tuple[MixRow, ...] = SEED_ROWS
    preset: str = "smollm2-mix"
    """The training preset of the seed rows (named in the report's title)."""
    target_n: int = 48
    """Questions per finished cell; a cell with fewer is shown with its n."""

    @property
    def rows(self) -> tuple[MixRow, ...]:
        """Every row in table order: untrained, baseline, then the seeds."""
        return (UNTRAINED, BASELINE, *self.seeds)

    def times(self, length: int) -> str:
        """A length as a multiple of the training length: 2048 -> "4x"."""
        return f"{length / self.training_length:g}x"


MIX_LAYOUT = MixLayout()
"""Issue 24's grid: the smollm2-mix tasks, 48 questions per cell (the Makefile's smollm2-mix evaluation)."""


UNRECORDED = "unrecorded"
"""The dtype of a cell whose run_config.json predates evaluate.py recording it (or that has none)."""


@dataclass(frozen=True)
class MixScores:
    """The cells found under one eval dir, keyed by (row name, task, length)."""

    cells: dict[tuple[str, str, int], ResultRow]
    dtypes: dict[tuple[str, int], str] = field(default_factory=dict)
    """The weights' dtype each `{row}-{length}` dir's run recorded ("float32", "bfloat16", or UNRECORDED): greedy
    decoding of the same weights parts ways between dtypes, so rows compare like for like only within one."""
    weights: dict[tuple[str, str, int], str] = field(default_factory=dict)
    """Per cell (row name, task, length), the fingerprint of the weights that scored it (memagent.model.loading's
    `weights_fingerprint`, or UNRECORDED): a seed trained again is another model, even at the same path, and a row
    can mix models within one length when its cells come from different readings."""

    def cell(self, row: MixRow, task: str, length: int) -> ResultRow | None:
        """The row's score on the task at that length, or None when no question of it was scored yet."""
        return self.cells.get((row.name, task, length))


@dataclass(frozen=True)
class SeedSpread:
    """One score (percent) over the RL seeds that have it."""

    seeds: tuple[str, ...]
    """Names of the seed rows that have it."""
    values: tuple[float, ...]
    """Each seed's score, percent."""
    ns: tuple[int, ...]
    """Questions behind each seed's score (the fewest of its cells, for an average)."""

    @property
    def mean(self) -> float:
        """Unweighted mean over the seeds (each seed counts once, whatever its n)."""
        return statistics.fmean(self.values)

    @property
    def std(self) -> float | None:
        """Sample standard deviation (n - 1) over the seeds; None with a single seed."""
        return statistics.stdev(self.values) if len(self.values) > 1 else None


def read_traces(path: str | Path) -> list[dict[str, Any]]:
    """The records of a traces.jsonl, without its last line when that was cut off (no newline at the end)."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    whole_lines = text[: text.rfind("\n") + 1].splitlines()
    records = []
    for number, line in enumerate(whole_lines, 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{number}: not a JSON trace record ({e.msg})") from e
    return records


def read_mix_scores(eval_dir: str | Path, layout: MixLayout = MIX_LAYOUT) -> MixScores:
    """Aggregate the traces of every `{row}-{length}` dir of the layout's rows under `eval_dir` (other dirs and
    files are not ours and are left alone); a row's dir may hold other methods' traces, only its own count."""
    eval_dir = Path(eval_dir)
    if not eval_dir.is_dir():
        raise ValueError(f"--eval-dir {eval_dir}: not a directory")
    rows = {row.name: row for row in layout.rows}
    cells: dict[tuple[str, str, int], ResultRow] = {}
    dtypes: dict[tuple[str, int], str] = {}
    weights: dict[tuple[str, str, int], str] = {}
    for directory in sorted(eval_dir.iterdir()):
        name, _, length = directory.name.rpartition("-")
        traces = directory / "traces.jsonl"
        if name not in rows or not length.isdigit() or not traces.is_file():
            continue
        records = [r for r in read_traces(traces) if r.get("method") == rows[name].method]
        fingerprint = recorded_setting(directory / "run_config.json", "weights")
        for result in aggregate(records):
            cells[(name, result.source, result.length)] = result
            weights[(name, result.source, result.length)] = fingerprint
        dtypes[(name, int(length))] = recorded_setting(directory / "run_config.json", "dtype")
    return MixScores(cells, dtypes, weights)


def recorded_setting(run_config: Path, key: str) -> str:
    """The value evaluate.py recorded under `key` ("dtype", "weights") in a cell's run_config.json, or UNRECORDED."""
    if not run_config.is_file():
        return UNRECORDED
    try:
        recorded = json.loads(run_config.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{run_config}: not JSON ({e.msg} at line {e.lineno})") from e
    return recorded.get(key) or UNRECORDED


def seed_spread(scores: MixScores, task: str, length: int, layout: MixLayout = MIX_LAYOUT) -> SeedSpread | None:
    """The cell's score over the seeds that have it, or None when no seed has it."""
    found = [(row.name, cell) for row in layout.seeds if (cell := scores.cell(row, task, length)) is not None]
    if not found:
        return None
    return SeedSpread(tuple(name for name, _ in found), tuple(c.score for _, c in found), tuple(c.n for _, c in found))


def rl_gain(scores: MixScores, task: str, length: int, layout: MixLayout = MIX_LAYOUT) -> float | None:
    """Points of the RL mean over the seeds above the untrained model in one cell, or None unless both exist."""
    spread, untrained = seed_spread(scores, task, length, layout), scores.cell(UNTRAINED, task, length)
    return None if spread is None or untrained is None else spread.mean - untrained.score


@dataclass(frozen=True)
class RowAverage:
    """A row's mean score over a table's cells."""

    score: float
    """Unweighted mean of the cells' scores, percent."""
    fewest_n: int
    """Questions in the row's least finished cell."""


def row_average(scores: MixScores, row: MixRow, cells: list[tuple[str, int]]) -> RowAverage | None:
    """The row's mean over the (task, length) cells, or None unless it has every cell (an average over whichever
    cells exist would not compare across rows)."""
    found = [scores.cell(row, task, length) for task, length in cells]
    if not cells or any(cell is None for cell in found):
        return None
    return RowAverage(statistics.fmean(cell.score for cell in found), min(cell.n for cell in found))


def seed_average_spread(scores: MixScores, cells: list[tuple[str, int]],
                        layout: MixLayout = MIX_LAYOUT) -> SeedSpread | None:
    """Each seed's row average over the cells, over the seeds that have every cell; None when none has."""
    found = [(row.name, avg) for row in layout.seeds if (avg := row_average(scores, row, cells)) is not None]
    if not found:
        return None
    return SeedSpread(tuple(name for name, _ in found), tuple(avg.score for _, avg in found),
                      tuple(avg.fewest_n for _, avg in found))
