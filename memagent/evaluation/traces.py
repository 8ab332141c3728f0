"""Per-sample trace files that make an evaluation resumable.

Every finished sample is one JSON line, appended and fsync'ed at once, so a killed run loses at most the samples
in flight. On start the file is read back and each line's key (source, length, index, method) marks that sample
as done: a rerun skips it instead of recomputing it, and never writes it twice.

A kill can leave the last line cut off (no newline, or not valid JSON). That line is dropped and the file is cut
back to the end of the last whole line before anything new is appended; otherwise the next record would be glued
onto the fragment. A broken line anywhere else is not a kill: it raises, naming the line.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

BUSY_STATUS = 75
"""evaluate.py's exit status when another process holds its output directory (EX_TEMPFAIL: try again later)."""

TraceKey = tuple[str, int, int, str]
"""(source: data file stem or task name, length: document tokens it was built for, index, method)."""


def trace_key(record: dict[str, Any]) -> TraceKey:
    """The resume key of one trace record."""
    return (str(record["source"]), int(record["length"]), int(record["index"]), str(record["method"]))


class TraceFile:
    """An append-only JSONL file of trace records, repaired on open; `done` maps each key to its record."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.done: dict[TraceKey, dict[str, Any]] = {}
        self.dropped_partial_line = False
        """True when opening found and removed a cut-off last line (a killed run)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists():
            self._load_and_repair()

    def _load_and_repair(self) -> None:
        data = self.path.read_bytes()
        # Everything after the last newline is a line the dying run did not finish: drop it.
        whole = data[: data.rfind(b"\n") + 1]
        for number, line in enumerate(whole.split(b"\n")[:-1], start=1):
            record = _parse(line)
            if record is None:
                raise ValueError(f"{self.path}:{number}: not a JSON trace record; fix or delete the file")
            key = trace_key(record)
            if key in self.done:
                raise ValueError(f"{self.path}:{number}: duplicate trace for {key}; fix or delete the file")
            self.done[key] = record
        if len(whole) < len(data):
            self.dropped_partial_line = True
            with self.path.open("r+b") as f:
                f.truncate(len(whole))
                f.flush()
                os.fsync(f.fileno())

    def append(self, record: dict[str, Any]) -> None:
        """Write one record as a line and force it to disk; refuses a key that is already done."""
        key = trace_key(record)
        if key in self.done:
            raise ValueError(f"trace for {key} is already in {self.path}")
        line = json.dumps(record, ensure_ascii=False) + "\n"
        with self.path.open("a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
        self.done[key] = record


def _parse(line: bytes) -> dict[str, Any] | None:
    """The record on one line, or None when the line is not a complete trace record."""
    try:
        record = json.loads(line)
        trace_key(record)
    except (ValueError, KeyError, TypeError):
        return None
    return record if isinstance(record, dict) else None
