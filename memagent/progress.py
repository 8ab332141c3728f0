"""Progress on long work, for every entry point: tqdm when it is installed, else a one-line counter on stderr.

tqdm is not a dependency, so the fallback keeps the same calls (`update(n)`, `close()`). `progress_bar` is for
work counted as it completes (evaluate.py's batches); `progress` wraps an iterable (the update loop, the warm start).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator
from typing import Protocol, TypeVar

T = TypeVar("T")


class Progress(Protocol):
    def update(self, n: int = 1) -> None: ...

    def close(self) -> None: ...


class _Counter:
    """Minimal stand-in for tqdm: rewrites "desc: done/total [elapsed]" in place."""

    def __init__(self, total: int | None, desc: str) -> None:
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
        total = "?" if self.total is None else self.total
        sys.stderr.write(f"\r{self.desc}: {self.done}/{total} [{elapsed:.0f}s]")
        sys.stderr.flush()


class _Silent:
    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


def progress_bar(total: int | None, desc: str, *, enabled: bool = True) -> Progress:
    """A progress bar over `total` items on stderr (nothing when not enabled, e.g. on ranks other than 0)."""
    if not enabled:
        return _Silent()
    try:
        from tqdm import tqdm
    except ImportError:
        return _Counter(total, desc)
    return tqdm(total=total, desc=desc, leave=False, file=sys.stderr, dynamic_ncols=True)


def progress(items: Iterable[T], *, desc: str, total: int | None = None, enabled: bool = True) -> Iterator[T]:
    """The items, advancing a progress_bar as each is consumed."""
    if total is None and hasattr(items, "__len__"):
        total = len(items)  # type: ignore[arg-type]
    bar = progress_bar(total, desc, enabled=enabled)
    try:
        for item in items:
            yield item
            bar.update(1)
    finally:
        bar.close()
