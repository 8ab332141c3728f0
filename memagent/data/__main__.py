"""`python -m memagent.data`: generate a task's samples offline and write them in any of our formats.

Example: python -m memagent.data --task niah_single_1 --length 8192 --num-samples 16 --tokenizer models/tiny \
  --out data/niah_single_1_8192.jsonl --format ruler
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from memagent.data.formats import format_for_path, write_samples
from memagent.data.rows import FORMATS
from memagent.data.tasks import TASKS, make_task


def parse_option(text: str) -> tuple[str, Any]:
    """KEY=VALUE, the value read as JSON when it parses (3, 0.5, null, true) and as a string otherwise."""
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"--option needs KEY=VALUE, got {text!r}")
    try:
        return key.replace("-", "_"), json.loads(raw)
    except json.JSONDecodeError:
        return key.replace("-", "_"), raw


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m memagent.data", description=__doc__.splitlines()[0])
    parser.add_argument("--task", required=True, choices=list(TASKS), help="task to generate")
    parser.add_argument("--length", required=True, type=int, help="context length in tokens of --tokenizer")
    parser.add_argument("--num-samples", required=True, type=int, help="number of samples")
    parser.add_argument(
        "--seed", type=int, default=0, help="seed (sample i is the same whatever --num-samples)"
    )
    parser.add_argument(
        "--tokenizer", required=True, type=Path, help="local directory of a saved HF tokenizer"
    )
    parser.add_argument("--out", required=True, type=Path, help="output file (.json, .jsonl or .parquet)")
    parser.add_argument(
        "--format",
        choices=FORMATS,
        default=None,
        help="eval | ruler | train (default: .json eval, .parquet train)",
    )
    parser.add_argument(
        "--option", action="append", type=parse_option, default=[], metavar="KEY=VALUE",
        help="task option, repeatable (e.g. --option depth=0.5 --option num_keys=4)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    fmt = args.format or format_for_path(args.out)  # fail on a bad path before the (possibly long) generation
    from memagent.model import load_tokenizer  # imported here: it pulls in transformers and torch

    tokenizer = load_tokenizer(args.tokenizer)
    start = time.perf_counter()
    samples = make_task(args.task, tokenizer, args.length, args.num_samples, args.seed, **dict(args.option))
    seconds = time.perf_counter() - start
    path = write_samples(args.out, samples, format=fmt)
    lengths = [s.length for s in samples]
    span = f"{min(lengths)}-{max(lengths)} tokens" if lengths else "no samples"
    print(f"wrote {len(samples)} {args.task} samples ({span}, {fmt} format) to {path} in {seconds:.1f}s")


if __name__ == "__main__":
    from memagent.cli import run_cli

    run_cli(main, on_interrupt=lambda argv: "nothing was written; rerun the command")
