"""A weighted mix of synthetic tasks (`data.tasks`): one task per question, so a group of G rollouts stays one task
while a batch draws questions of every task (docs/evaluation.md, "Task mix").

A mix is written as entries "name" or "name:weight" (weight 1 when left out), e.g.
`niah_single_1:2,niah_multikey_2,hotpotqa_synth`. `make_task_mix` splits the question count over the tasks in
proportion to their weights (largest remainder, so the counts sum exactly) and generates each task's share with
the task's own generator and the same seed, so a mix of one task is exactly `make_task` of that task.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from memagent.data.tasks import TASKS, make_task
from memagent.records import Sample


@dataclass(frozen=True)
class TaskShare:
    """One task of a mix and its weight."""

    name: str
    """A generator name in memagent.data.TASKS."""
    weight: float
    """Relative share of the questions (> 0); weights need not sum to 1."""


def parse_task_mix(entries: Sequence[str]) -> list[TaskShare]:
    """Parse "name" / "name:weight" entries; raise ValueError naming the bad entry (unknown task, bad weight, twice)."""
    shares: list[TaskShare] = []
    for entry in entries:
        name, sep, weight_text = entry.strip().partition(":")
        if name not in TASKS:
            raise ValueError(f"data.tasks entry {entry!r}: unknown task {name!r}; pass one of {', '.join(TASKS)}")
        try:
            weight = float(weight_text) if sep else 1.0
        except ValueError:
            raise ValueError(f"data.tasks entry {entry!r}: the weight after ':' must be a number") from None
        if not (math.isfinite(weight) and weight > 0):
            raise ValueError(f"data.tasks entry {entry!r}: the weight must be a finite number > 0")
        if any(s.name == name for s in shares):
            raise ValueError(f"data.tasks: task {name!r} appears twice; give it once with the summed weight")
        shares.append(TaskShare(name, weight))
    return shares


def split_counts(weights: Sequence[float], total: int) -> list[int]:
    """Split `total` items in proportion to `weights` (all > 0): floors first, then one more to the largest
    remainders (ties to the earlier entry). The counts sum to `total` and each is within 1 of its exact share."""
    scale = sum(weights)
    exact = [total * w / scale for w in weights]
    counts = [math.floor(x) for x in exact]
    by_remainder = sorted(range(len(weights)), key=lambda i: (counts[i] - exact[i], i))
    for i in by_remainder[: total - sum(counts)]:
        counts[i] += 1
    return counts


def make_task_mix(
    shares: Sequence[TaskShare], tokenizer: Any, length: int, num_samples: int, seed: int = 0
) -> list[Sample]:
    """`num_samples` questions at `length` context tokens, split over `shares` by weight (split_counts).

    Every task must get at least one question (a ValueError names those that would not). Samples come task after
    task in the order of `shares` (the training stream shuffles them) and are re-indexed 0..num_samples-1, so
    `Sample.index` stays unique across the mix; `Sample.task` names each one's task.
    """
    if not shares:
        raise ValueError("data.tasks is empty: give at least one task")
    counts = split_counts([s.weight for s in shares], num_samples)
    empty = [share.name for share, n in zip(shares, counts) if n == 0]
    if num_samples > 0 and empty:  # a task the user asked for would silently never appear
        raise ValueError(f"data.tasks: {', '.join(empty)} get 0 of {num_samples} questions at these weights; "
                         "ask for more questions (data.num_train / data.num_eval) or raise their weights")
    samples = [s for share, n in zip(shares, counts) for s in make_task(share.name, tokenizer, length, n, seed=seed)]
    return [replace(s, index=i) for i, s in enumerate(samples)]
