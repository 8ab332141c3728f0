"""The gated demo against its ungated twin (docs/gates.md, "The demo"): held-out accuracy, reading and generated tokens
per correct answer after RL, over seeds, read from the runs' results.json, and issue 25's target in small.

    python -m memagent.evaluation.demo_gates --ungated runs/tiny-4chunks-seed* --gated runs/tiny-gates-seed* \\
        [--markdown FILE] [--figure docs/figures/tiny_gates.png]

`make demo-gates SEED=N` trains one seed of both (presets `tiny-4chunks` and `tiny-gates`) and then runs this. A run
directory without results.json (not finished) is left out and named. The figure (needs matplotlib) puts generated
tokens per correct answer against accuracy, one point per model and held-out length, an arrow from ungated to gated.
The target, per held-out set: on the seeds' means, at least 2x fewer generated tokens per correct answer at an
accuracy at most 2 points below the ungated model's, or better.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from memagent.evaluation.plot import pyplot, save_figure

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
    """The results of the runs that finished, and the directories left out because they have not. Paths that are
    not directories (a shell glob like runs/tiny-gates-seed* also matches runs/tiny-gates-seed0.log) are skipped."""
    done = [d for d in run_dirs if (Path(d) / "results.json").is_file()]
    return [read_results(d) for d in done], [d for d in run_dirs if d not in done and not Path(d).is_file()]


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
    """One row per held-out set: accuracy, the gated model's chunks read, the mean wall time per question of both
    ("—" for runs from before it was recorded), generated tokens per correct answer (mean ± std over the seeds) and
    the ratio of the means, the gated KEEP / UPDATE / ANSWER shares, and the target."""
    lines = [f"Seeds: {len(ungated)} ungated, {len(gated)} gated (mean ± std).", "",
             "| held-out set | accuracy, ungated (%) | accuracy, gated (%) | chunks read, gated (%) | seconds per question, "
             "ungated / gated | generated tokens per correct, ungated | gated | fewer tokens | "
             "KEEP / UPDATE / ANSWER, gated (%) | target |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name in held_out_sets(ungated + gated):
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
        wall = " / ".join(f"{s[0]:.3f}" if (s := _spread(runs, f"perf/eval_seconds_per_question_{name}")) else "—"
                          for runs in (ungated, gated))
        lines.append(f"| {name} | {_fmt(acc_u)} | {_fmt(acc_g)} | {_fmt(read, 0)} | {wall} | {_fmt(tok_u)} | "
                     f"{_fmt(tok_g)} | {'—' if ratio is None else f'{ratio:.2f}x'} | {shares} | {verdict} |")
    return "\n".join(lines)


def held_out_sets(runs: list[dict[str, float]]) -> list[str]:
    """The held-out set names ("1x", "4x", ...) of the runs, shortest documents first."""
    return sorted({k.removeprefix("eval/accuracy_") for run in runs for k in run if k.startswith("eval/accuracy_")},
                  key=lambda n: (len(n), n))


def draw_figure(ungated: list[dict[str, float]], gated: list[dict[str, float]], out: str | Path) -> Path:
    """PNG: the seeds' mean generated tokens per correct answer (log) against mean accuracy, one point per model and
    held-out set, an arrow from ungated to gated."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(4.8, 3.8))
    colors = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple")
    for name, color in zip(held_out_sets(ungated + gated), colors):
        points = {}
        for model, runs, marker in (("ungated", ungated, "o"), ("gated", gated, "^")):
            acc, tokens = _spread(runs, f"eval/accuracy_{name}", 100), _spread(runs, f"eval/generated_tokens_per_correct_{name}")
            if acc is not None and tokens is not None:
                points[model] = (acc[0], tokens[0])
                ax.plot(*points[model], marker, color=color, label=f"{model} {name}")
        if len(points) == 2:
            ax.annotate("", xy=points["gated"], xytext=points["ungated"],
                        arrowprops={"arrowstyle": "->", "color": color, "alpha": 0.6})
    ax.set(yscale="log", xlim=(-3, 103), xlabel="held-out accuracy (%)", ylabel="generated tokens per correct answer",
           title=f"gated demo vs ungated twin ({len(gated)} / {len(ungated)} seeds)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    return save_figure(fig, out)


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(prog="python -m memagent.evaluation.demo_gates", description=__doc__.splitlines()[0])
    parser.add_argument("--ungated", nargs="+", required=True, help="run directories of the ungated twin (tiny-4chunks)")
    parser.add_argument("--gated", nargs="+", required=True, help="run directories of the gated runs (tiny-gates)")
    parser.add_argument("--markdown", default="", help="also write the table to this file")
    parser.add_argument("--figure", default="", help="also draw tokens per correct answer against accuracy (a PNG)")
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
    if args.figure:
        print(f"wrote {draw_figure(ungated, gated, args.figure)}", file=sys.stderr)
    return table


def cli(argv: list[str] | None = None) -> None:
    """main() with a user error as one line `error: ...` and exit status 2."""
    try:
        main(argv)
    except (ValueError, RuntimeError) as err:  # RuntimeError: --figure without matplotlib
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    cli()
