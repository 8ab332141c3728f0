"""The gated demo against its ungated twin (docs/gates.md, "The demo"): held-out accuracy, reading and generated tokens
per correct answer after RL, over seeds, read from the runs' results.json, and issue 25's target in small.

    python -m memagent.demo.gates_compare --ungated runs/tiny-4chunks-seed* --gated runs/tiny-gates-seed* \\
        [--markdown FILE]

`make demo-gates SEED=N` trains one seed of both (presets `tiny-4chunks` and `tiny-gates`) and then runs this. A run
directory without results.json (not finished) is left out and named. The target, per held-out set: on the seeds'
means, at least 2x fewer generated tokens per correct answer at an accuracy at most 2 points below the ungated
model's, or better.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

TOKEN_RATIO_TARGET = 2.0
"""Issue 25: the gated model generates at least this many times fewer tokens per correct answer..."""
ACCURACY_TOLERANCE = 2.0
"""...at an accuracy at most this many points below the ungated model's."""


def read_results(run_dir: str | Path) -> dict[str, float]:
    """The after-RL held-out metrics of a finished train.py run (`{run_dir}/results.json`, key "after")."""
    path = Path(run_dir) / "results.json"
    try:
        after = json.loads(path.read_text())["after"]
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise ValueError(f"{path}: expected a train.py results.json with an \"after\" object ({err})") from err
    if not any(key.startswith("eval/accuracy_") for key in after):
        raise ValueError(f"{path}: \"after\" holds no eval/accuracy_* metric (a run with data.num_eval 0?)")
    return after


def finished_runs(run_dirs: list[str]) -> tuple[list[dict[str, float]], list[str]]:
    """The results of the runs that finished, and the directories left out because they have not."""
    done = [d for d in run_dirs if (Path(d) / "results.json").is_file()]
    return [read_results(d) for d in done], [d for d in run_dirs if d not in done]


def _spread(runs: list[dict[str, float]], key: str, scale: float = 1.0) -> tuple[float, float] | None:
    """Mean and sample standard deviation (0 for one run) of `key` over the runs that have it."""
    values = [scale * run[key] for run in runs if key in run]
    if not values:
        return None
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def _fmt(spread: tuple[float, float] | None, digits: int = 1) -> str:
    if spread is None:
        return "—"
    mean, std = spread
    return f"{mean:.{digits}f} ± {std:.{digits}f}"


def comparison_markdown(ungated: list[dict[str, float]], gated: list[dict[str, float]]) -> str:
    """One row per held-out set: accuracy, the gated model's chunks read, generated tokens per correct answer (mean ±
    std over the seeds) and the ratio of the means, the gated KEEP / UPDATE / ANSWER shares, and the target."""
    lines = [f"Seeds: {len(ungated)} ungated, {len(gated)} gated (mean ± std).", "",
             "| held-out set | accuracy, ungated (%) | accuracy, gated (%) | chunks read, gated (%) | generated tokens "
             "per correct, ungated | gated | fewer tokens | KEEP / UPDATE / ANSWER, gated (%) | target |",
             "|---|---|---|---|---|---|---|---|---|"]
    names = sorted({k.removeprefix("eval/accuracy_") for run in ungated + gated for k in run
                    if k.startswith("eval/accuracy_")}, key=lambda n: (len(n), n))
    for name in names:
        acc_u, acc_g = (_spread(runs, f"eval/accuracy_{name}", 100) for runs in (ungated, gated))
        tok_u, tok_g = (_spread(runs, f"eval/generated_tokens_per_correct_{name}") for runs in (ungated, gated))
        ratio = tok_u[0] / tok_g[0] if tok_u and tok_g and tok_g[0] > 0 else None
        shares = " / ".join(f"{s[0]:.0f}" if (s := _spread(gated, f"eval/{word}_share_{name}", 100)) else "—"
                            for word in ("keep", "update", "answer"))
        if acc_u is None or acc_g is None or ratio is None:
            verdict = "not measured"
        else:
            held = ratio >= TOKEN_RATIO_TARGET and acc_u[0] - acc_g[0] <= ACCURACY_TOLERANCE
            verdict = "met" if held else "missed"
        read = _spread(gated, f"eval/chunks_read_share_{name}", 100)
        lines.append(f"| {name} | {_fmt(acc_u)} | {_fmt(acc_g)} | {_fmt(read, 0)} | {_fmt(tok_u)} | {_fmt(tok_g)} | "
                     f"{'—' if ratio is None else f'{ratio:.2f}x'} | {shares} | {verdict} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(prog="python -m memagent.demo.gates_compare", description=__doc__.splitlines()[0])
    parser.add_argument("--ungated", nargs="+", required=True, help="run directories of the ungated twin (tiny-4chunks)")
    parser.add_argument("--gated", nargs="+", required=True, help="run directories of the gated runs (tiny-gates)")
    parser.add_argument("--markdown", default="", help="also write the table to this file")
    args = parser.parse_args(argv)
    (ungated, missing_u), (gated, missing_g) = finished_runs(args.ungated), finished_runs(args.gated)
    for run_dir in missing_u + missing_g:
        print(f"left out (no results.json yet): {run_dir}", file=sys.stderr)
    if not ungated or not gated:
        raise ValueError("no finished run on one side: train both first (`make demo-gates SEED=0`)")
    table = comparison_markdown(ungated, gated)
    if args.markdown:
        Path(args.markdown).write_text(table + "\n")
    print(table)
    return table


def cli(argv: list[str] | None = None) -> None:
    """main() with a user error as one line `error: ...` and exit status 2."""
    try:
        main(argv)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    cli()
