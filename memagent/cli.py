"""How our command lines end: a user error is one `error: ...` line and exit status 2, Ctrl-C says how to resume.

User errors are the ValueErrors and OSErrors our loaders raise on bad input (a bad file, field or flag value, a
missing model directory), and `SystemExit("message")`; their messages name the file, line and field. Anything
else is our bug and keeps its traceback. `--debug` (anywhere on the command line; it is removed before parsing) or
MEMAGENT_DEBUG=1 shows the traceback of user errors too.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any, NoReturn

USER_ERRORS = (ValueError, OSError)
"""Exception types reported as one line: bad values and files (JSONDecodeError and UnicodeDecodeError included)."""
USAGE_STATUS = 2
"""Exit status of a user error (argparse's too)."""
INTERRUPTED_STATUS = 130
"""Exit status after Ctrl-C (128 + SIGINT), the shell convention."""


def debug_requested(argv: list[str]) -> bool:
    """--debug on the command line or MEMAGENT_DEBUG set to anything but '' / '0'."""
    return "--debug" in argv or os.environ.get("MEMAGENT_DEBUG", "") not in ("", "0")


def run_cli(main: Callable[[list[str]], Any], argv: list[str] | None = None, *,
            on_interrupt: Callable[[list[str]], str] | None = None) -> NoReturn:
    """Run `main(argv)` and exit: its int result (0 for anything else), 2 on a user error, 130 on Ctrl-C.

    on_interrupt(argv) returns where the run can be resumed from; it is printed after "interrupted".
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = debug_requested(argv)
    argv = [a for a in argv if a != "--debug"]
    try:
        result = main(argv)
    except KeyboardInterrupt:
        hint = ""
        if on_interrupt is not None:
            try:
                hint = f": {on_interrupt(argv)}"
            except USER_ERRORS:  # the hint is best effort; the interrupt is what the user asked for
                hint = ""
        print(f"\ninterrupted{hint}", file=sys.stderr, flush=True)
        sys.exit(INTERRUPTED_STATUS)
    except SystemExit as e:
        if isinstance(e.code, str):  # SystemExit("message"): a user error raised by the script itself
            fail(e.code, debug, e)
        raise
    except USER_ERRORS as e:
        fail(str(e) or type(e).__name__, debug, e)
    sys.exit(result if isinstance(result, int) else 0)


def fail(message: str, debug: bool, error: BaseException) -> NoReturn:
    """Print `error: message` (after the traceback when debugging) and exit with USAGE_STATUS."""
    if debug:
        import traceback

        traceback.print_exception(error)
    print(f"error: {' '.join(message.split())}", file=sys.stderr, flush=True)  # one line, whatever the message
    sys.exit(USAGE_STATUS)
