"""The ledger of MemAgent's evaluation in small (issue 24; docs/evaluation.md, "The ledger"): every cell's score kept
in one small JSON file under version control, so the table and the figure outlive the run directories they came
from.

A cell of the grid costs from minutes (1x) to core-hours (64x) and the grid fills in over many sessions, on machines
that do not keep `runs/`. The report reads the ledger beside the traces: a cell found in both is taken from whichever
scored more questions (the traces on a tie: they are the newer reading), and `--update-ledger` writes the merged
cells back. Only what the tables and targets need is kept (score, n, the weights' dtype and fingerprint, when and from what it
was recorded); traces stay where they were written.

A ledger is a JSON object {"cells": [...]}, one object per cell with the fields of RecordedCell. Run as a module it
says which tasks of one cell still need scoring, so `make smollm2-mix` spends no time on cells already recorded:

    python -m memagent.evaluation.mix_ledger --ledger docs/results/smollm2_mix_cells.json --row seed0 \
        --length 2048 --dtype auto --model runs/smollm2-mix-seed0/checkpoints/step_000010/model \
        --tasks vt fwe kv_retrieval      # prints the unfinished ones, space separated

A LoRA seed (preset smollm2-mix-lora) is asked about as it is scored, `--model BASE --adapter FILE`: its readings
carry the fingerprint of the base's weights and the adapter's bytes together.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from memagent.evaluation.mix_scores import UNRECORDED, MixLayout, MixScores
from memagent.evaluation.tables import ResultRow
from memagent.model.loading import resolve_device, resolve_dtype, weights_fingerprint
from memagent.model.precision import dtype_name

FROM_TRACES = "traces"
"""RecordedCell.origin of a cell the report read from a run's traces.jsonl."""


@dataclass(frozen=True)
class RecordedCell:
    """One cell of the grid as the ledger keeps it."""

    row: str
    """The row's directory prefix ("untrained", "baseline", "seed0", ...)."""
    task: str
    """Task name."""
    length: int
    """Document tokens."""
    n: int
    """Questions scored."""
    score: float
    """Mean primary metric x 100 over the n questions."""
    metric: str
    """Name of the primary metric (string_match_all or sub_em)."""
    chunks: float
    """Mean chunks per document."""
    dtype: str
    """The weights' dtype the cell was scored in ("float32", "bfloat16" or "unrecorded")."""
    weights: str
    """Fingerprint of the weights scored (memagent.model.loading's `weights_fingerprint`), or "unrecorded"."""
    recorded: str
    """Date (YYYY-MM-DD) the ledger first held this reading."""
    origin: str
    """Where the reading came from: "traces" (the report, from traces.jsonl) or a note naming a table it was copied
    from after its traces were lost."""


def read_ledger(path: str | Path) -> list[RecordedCell]:
    """The cells of a ledger file; an absent file is an empty ledger. Refuses a cell with missing or unknown fields,
    naming the file and the cell's position."""
    path = Path(path)
    if not path.exists():
        return []
    try:
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise ValueError(f"{path}: not a ledger (a JSON object with a \"cells\" list): {e}") from e
    fields = {f.name for f in dataclasses.fields(RecordedCell)}
    out = []
    for i, cell in enumerate(cells):
        if not isinstance(cell, dict) or set(cell) != fields:
            got = sorted(cell) if isinstance(cell, dict) else type(cell).__name__
            raise ValueError(f"{path}: cell {i}: expected the fields {sorted(fields)}, got {got}")
        out.append(RecordedCell(**cell))
    return out


def write_ledger(path: str | Path, cells: list[RecordedCell]) -> None:
    """Write the cells sorted by row, length and task, one cell per line, through a temporary file, so an
    interrupted write leaves the old ledger whole."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    ordered = sorted(cells, key=lambda c: (c.row, c.length, c.task))
    lines = ",\n".join("    " + json.dumps(dataclasses.asdict(c)) for c in ordered)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text('{\n  "cells": [\n' + lines + "\n  ]\n}\n", encoding="utf-8")
    tmp.replace(path)


def as_result_row(cell: RecordedCell, method: str) -> ResultRow:
    """The ledger cell as the report's ResultRow. The ledger keeps no timings or costs: seconds_per_sample is NaN and
    the cost fields None, which the mix report never reads."""
    return ResultRow(method=method, source=cell.task, length=cell.length, chunks=cell.chunks, n=cell.n, failed=0,
                     score=cell.score, metric=cell.metric, em=None, f1=None, seconds_per_sample=float("nan"))


def with_ledger(scores: MixScores, ledger: list[RecordedCell], layout: MixLayout) -> MixScores:
    """The run cells and the ledger's together: per cell the reading with more questions, the run's on a tie. A
    ledger cell of a row the layout does not have is left out. The dtype of a (row, length) with no run dir comes
    from its ledger cells; a cell's weights fingerprint comes with the reading taken."""
    methods = {row.name: row.method for row in layout.rows}
    cells = dict(scores.cells)
    dtypes = dict(scores.dtypes)
    weights = dict(scores.weights)
    for cell in ledger:
        if cell.row not in methods:
            continue
        key = (cell.row, cell.task, cell.length)
        if key not in cells or cells[key].n < cell.n:
            cells[key] = as_result_row(cell, methods[cell.row])
            weights[key] = cell.weights
        dtypes.setdefault((cell.row, cell.length), cell.dtype)
    return MixScores(cells, dtypes, weights)


def updated_ledger(ledger: list[RecordedCell], scores: MixScores, today: str) -> list[RecordedCell]:
    """The ledger with every run cell that has at least as many questions as its recorded reading put in (dated
    `today`, origin "traces"); a reading identical in n and score keeps its entry and date."""
    by_key = {(c.row, c.task, c.length): c for c in ledger}
    for (row, task, length), result in scores.cells.items():
        old = by_key.get((row, task, length))
        if old is not None and (result.n < old.n or (result.n == old.n and abs(result.score - old.score) < 1e-9)):
            continue
        by_key[(row, task, length)] = RecordedCell(
            row=row, task=task, length=length, n=result.n, score=result.score, metric=result.metric,
            chunks=result.chunks, dtype=scores.dtypes.get((row, length), UNRECORDED),
            weights=scores.weights.get((row, task, length), UNRECORDED), recorded=today, origin=FROM_TRACES)
    return list(by_key.values())


def unfinished_tasks(ledger: list[RecordedCell], row: str, length: int, tasks: list[str], target_n: int,
                     dtype: str, weights: str) -> list[str]:
    """The tasks, in the given order, without a finished reading for the row at that length: none recorded, fewer
    than target_n questions, one scored in another dtype than `dtype` (greedy decoding parts ways between dtypes;
    a reading whose dtype went unrecorded counts as any), or one of other weights than the fingerprint `weights`
    (a seed trained again is another model; a reading whose weights went unrecorded counts as other weights)."""
    finished = {c.task for c in ledger if c.row == row and c.length == length and c.n >= target_n
                and c.dtype in (dtype, UNRECORDED) and c.weights == weights != UNRECORDED}
    return [task for task in tasks if task not in finished]


def main(argv: list[str] | None = None) -> None:
    """Print the unfinished tasks of one cell, space separated (an empty line when every task is recorded)."""
    parser = argparse.ArgumentParser(description="The tasks of one cell the ledger has no finished reading of.")
    parser.add_argument("--ledger", required=True, help="the ledger JSON (an absent file is an empty ledger)")
    parser.add_argument("--row", required=True, help="row directory prefix: untrained, baseline, seed0, ...")
    parser.add_argument("--length", type=int, required=True, help="document tokens")
    parser.add_argument("--tasks", nargs="+", required=True, help="the cell's tasks")
    parser.add_argument("--model", required=True, help="the model directory the cell evaluates (its weights' fingerprint)")
    parser.add_argument("--adapter", default=None, help="evaluate.py's --adapter (part of the weights' fingerprint)")
    parser.add_argument("--dtype", default="auto", help="evaluate.py's --dtype; auto is resolved as evaluate.py does")
    parser.add_argument("--device", default=None, help="evaluate.py's --device (resolves --dtype auto)")
    parser.add_argument("--target-n", type=int, default=48, help="questions in a finished reading")
    args = parser.parse_args(argv)
    try:
        dtype = dtype_name(resolve_dtype(args.dtype, resolve_device(args.device)))
        print(" ".join(unfinished_tasks(read_ledger(args.ledger), args.row, args.length, args.tasks, args.target_n,
                                        dtype, weights_fingerprint(args.model, args.adapter))))
    except ValueError as e:
        parser.error(str(e))


if __name__ == "__main__":
    main()
