"""One writer per output directory: an advisory lock that the kernel drops when its holder exits.

Training and evaluation both append to files in their output directory (metrics.jsonl, traces.jsonl,
inflight.jsonl) and write checkpoints there, and both resume from what they find. Two processes writing one
directory would interleave those files and save over each other's checkpoints, and each would resume from a
state the other is changing. So a command holds an exclusive `flock` on a file in the directory for as long as it
runs. A lock taken with `flock` belongs to the open file: the kernel releases it when the holder exits, killed or
not, so a crash never leaves a stale lock behind (a pid file alone would).
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import IO


class OutputDirBusy(OSError):
    """Another process holds the output directory's lock; `holder` names it ("pid N").

    An OSError, so a command line reports it as a one-line user error (memagent.cli)."""

    def __init__(self, out: Path, holder: str) -> None:
        super().__init__(f"{out} is being written by another run ({holder}); rerun this command once it ends, "
                         "or pass another output directory")
        self.holder = holder


def lock_file_name(rank: int = 0) -> str:
    """`.lock` for a single process or rank 0; `.lock-rank{rank}` for the other ranks of a distributed run, so each
    rank of one run holds its own file and a second launch fails on every rank at once, with no collective."""
    return ".lock" if rank == 0 else f".lock-rank{rank}"


def lock_output_dir(out: Path, rank: int = 0) -> IO[str]:
    """Hold an exclusive lock on `out` (the file `out/lock_file_name(rank)`) for as long as the returned file stays
    open; closing it (or the process ending) releases it. `out` must exist.

    Raises OutputDirBusy, naming the holder's pid, when another process (or another open of the same file in this
    process) holds it.
    """
    path = out / lock_file_name(rank)
    handle = path.open("a+", encoding="utf-8")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise OutputDirBusy(out, path.read_text().strip() or "another process") from None
    handle.truncate(0)
    handle.write(f"pid {os.getpid()}\n")
    handle.flush()
    return handle
