"""Helpers of the evaluate.py tests: a small generated-task command line and the traces it writes."""

from __future__ import annotations

import json
from pathlib import Path


def evaluate_argv(model_dir: Path, out: Path, *extra: str) -> list[str]:
    """evaluate.py flags for 3 kv_retrieval questions of 200 tokens, greedy, tiny budgets, written to `out`."""
    return ["--model", str(model_dir), "--task", "kv_retrieval", "--lengths", "200", "--num-samples", "3",
            "--chunk-tokens", "96", "--memory-tokens", "6", "--answer-tokens", "6", "--greedy", "--batch-size", "2",
            "--output-dir", str(out), *extra]


def read_traces(out: Path) -> list[dict]:
    """The trace lines of an evaluate.py output dir."""
    return [json.loads(line) for line in (out / "traces.jsonl").read_text().splitlines()]
