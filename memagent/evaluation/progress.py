"""A progress bar for the entry points: tqdm when it is installed, else a one-line counter on stderr.

tqdm is not a dependency (README, Dependencies), so the fallback keeps the same two calls (`update(n)`, `close()`).
The library itself never shows progress; only evaluate.py and bench scripts do.
"""

from __future__ import annotations

import sys
import time
from typing import Protocol


class Progress(Protocol):
    def update(self, n: int = 1) -> None: ...

    def close(self) -> None: ...


class _Counter:
    """Minimal stand-in for tqdm: rewrites "desc: done/total [elapsed]" in place."""

    def __init__(self, total: int, desc: str) -> None:
        self.total, self.desc, self.done = total, desc, 0
        self.start = time.monotonic()
        self._show()

    def update(self, n: int = 1) -> None:
        self.done += n
        self._show()

    def close(self) -> None:
        sys.stderr.write("\n")
        sys.stderr.flush()

    def _show(self) -> None:
        elapsed = time.monotonic() - self.start
        sys.stderr.write(f"\r{self.desc}: {self.done}/{self.total} [{elapsed:.0f}s]")
        sys.stderr.flush()


def progress(total: int, desc: str) -> Progress:
    """A progress bar over `total` items."""
    try:
        from tqdm import tqdm
    except ImportError:
        return _Counter(total, desc)
    return tqdm(total=total, desc=desc, dynamic_ncols=True)
