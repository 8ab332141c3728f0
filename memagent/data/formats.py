"""Read and write samples as MemAgent eval JSON, RULER JSONL, or MemAgent training parquet / JSONL.

`read_samples(path)` picks the container from the extension (.json: one JSON list; .parquet; anything else:
JSON Lines) and the row format from the first row's keys (rows.py lists the three). Errors name the file, the
line (JSON Lines), item (JSON list) or row (parquet), and the field. Nothing is skipped silently: invalid rows
raise unless `skip_invalid=True`, which skips them and warns with the count. Parquet needs pyarrow, an optional
dependency; training data can always be written as JSONL with the same fields instead.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from memagent.data.rows import FORMATS, FROM_ROW, TO_ROW, TRAIN_COLUMNS, FieldError, detect_row_format
from memagent.records import Sample


def _pyarrow(path: Path) -> Any:
    try:
        import pyarrow.parquet as pq
    except ImportError as err:
        raise RuntimeError(
            f"{path}: parquet needs pyarrow, which is not installed: install it, or use a .jsonl path "
            "(MemAgent's training fields, one JSON object per line)"
        ) from err
    return pq


def _text(path: Path) -> str:
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not UTF-8 text (invalid byte at offset {err.start})") from None


def _rows(path: Path) -> Iterator[tuple[str, Any]]:
    """(location, parsed row) pairs; a JSON Lines row that does not parse comes as (location, JSONDecodeError)."""
    if path.suffix == ".parquet":
        for i, row in enumerate(_pyarrow(path).read_table(path).to_pylist()):
            yield f"{path} row {i}", row
        return
    text = _text(path)
    if path.suffix == ".json":
        try:
            items = json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(
                f"{path} line {err.lineno} column {err.colno}: invalid JSON: {err.msg}"
            ) from None
        if not isinstance(items, list):
            raise ValueError(f"{path}: expected a JSON list of rows (MemAgent's eval_{{N}}.json layout)")
        for i, item in enumerate(items):
            yield f"{path} item {i}", item
        return
    # Split on "\n" only: str.splitlines() also breaks at U+0085, U+2028, ..., which JSON leaves unescaped.
    for n, line in enumerate(text.split("\n"), 1):
        if line.strip():
            try:
                yield f"{path} line {n}", json.loads(line)
            except json.JSONDecodeError as err:
                yield f"{path} line {n}", err


def read_samples(
    path: str | Path,
    *,
    format: str | None = None,
    allow_empty_context: bool = False,
    skip_invalid: bool = False,
) -> list[Sample]:
    """Samples of an eval JSON, RULER JSONL or training parquet/JSONL file (format: one of FORMATS or None).

    Raises ValueError naming the file, line and field of the first invalid row, unless `skip_invalid`.
    """
    path = Path(path)
    if format is not None and format not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got {format!r}")
    samples: list[Sample] = []
    skipped: list[str] = []
    position = 0
    for where, row in _rows(path):
        try:
            if isinstance(row, json.JSONDecodeError):
                raise ValueError(f"{where}: invalid JSON: {row.msg} (column {row.colno})")
            if not isinstance(row, dict):
                raise ValueError(f"{where}: a row must be a JSON object, got {type(row).__name__}")
            if format is None:
                format = detect_row_format(row)
                if format is None:
                    raise ValueError(
                        f"{where}: cannot tell the format from the keys {sorted(row)}: pass format= one of {FORMATS}"
                    )
            try:
                samples.append(FROM_ROW[format](row, position, allow_empty_context))
            except FieldError as err:
                raise ValueError(f"{where}: {err}") from None
        except ValueError as err:
            if not skip_invalid:
                raise
            skipped.append(str(err))
        position += 1
    if skipped:
        warnings.warn(f"{path}: skipped {len(skipped)} invalid rows; the first: {skipped[0]}", stacklevel=2)
    return samples


def format_for_path(path: str | Path) -> str:
    """The default format of an output path: .json -> eval, .parquet -> train; a .jsonl path needs `format`."""
    suffix = Path(path).suffix
    if suffix == ".json":
        return "eval"
    if suffix == ".parquet":
        return "train"
    raise ValueError(
        f"{path}: pass format='ruler' or format='train' (JSON Lines), or use a .json / .parquet path"
    )


def write_samples(path: str | Path, samples: Iterable[Sample], *, format: str | None = None) -> Path:
    """Write samples: "eval" as one JSON list (.json), "ruler" as JSON Lines, "train" as parquet or JSON Lines.

    The container follows the extension (.json, .parquet, anything else JSON Lines); eval data must go to a
    .json path and RULER data to a JSON Lines one. Returns the path.
    """
    path = Path(path)
    format = format or format_for_path(path)
    if format not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got {format!r}")
    if (format == "eval") != (path.suffix == ".json") or (format == "ruler" and path.suffix == ".parquet"):
        raise ValueError(
            f"{path}: format {format!r} is written as {'.json' if format == 'eval' else '.jsonl'}"
        )
    rows = [TO_ROW[format](s) for s in samples]
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".parquet":
        pq = _pyarrow(path)
        import pyarrow as pa

        pq.write_table(pa.table({c: [r[c] for r in rows] for c in TRAIN_COLUMNS}), path)
    elif format == "eval":
        path.write_text(json.dumps(rows, ensure_ascii=False), encoding="utf-8")
    else:
        with path.open("w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return path
