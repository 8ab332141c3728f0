"""Answers that hedge: credited for a gold while they also name other candidate values (docs/evaluation.md,
"What the memory learned").

RULER's string_match_all, which MemAgent trains and scores its RULER-style tasks with (arXiv 2507.02259, Sec. 4;
memagent.verify.ruler), credits every gold contained in the answer and charges nothing for what stands beside it. An
answer that lists every needle it kept ("... soft-beacon is 3584655. ... modern-blanket is 4593036. ...") scores
1 on niah_multikey_2 whenever the asked value is among them, so RL can raise the score by listing instead of
choosing. This module measures how much of a cell's score is such listing:

    other values     values of the golds' shape in the extracted answer that are neither a gold nor in the
                     question (a key the question names is not an answer): 7-digit numbers next to a 7-digit gold,
                     UUIDs next to a UUID gold
    hedged           a credited answer (score > 0) that names at least one other value
    one-value score  the score with every hedged answer scored 0: what the row earns when it commits to values
    first-k score    the answer read as its first k values of that shape, k = the number of golds (the fraction
                     of golds among them): credits an answer that names the asked value first and others after
                     ("soft-beacon is 3584655. modern-blanket is 4593036."), not one that leads with a distractor

Only golds made of digits or UUIDs have a shape to look for (the NIAH tasks and kv_retrieval); word answers (vt,
fwe) and QA are left out, since any English word would match their shape.

    python -m memagent.evaluation.hedging runs/mix-eval/untrained-512 runs/mix-eval/seed0-512 runs/mix-eval/seed1-512
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memagent.evaluation.mix_scores import read_traces
from memagent.evaluation.tables import markdown_table

UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"


def value_pattern(golds: Sequence[str]) -> re.Pattern[str] | None:
    """A regex for strings shaped like `golds`: digit runs of exactly the golds' lengths, or UUIDs; None when the
    golds are of neither shape (or mix them)."""
    if golds and all(re.fullmatch(UUID, g.lower()) for g in golds):
        return re.compile(UUID, re.IGNORECASE)
    if golds and all(g.isdigit() for g in golds):
        runs = "|".join(rf"\d{{{n}}}" for n in sorted({len(g) for g in golds}))
        return re.compile(rf"(?<!\d)(?:{runs})(?!\d)")
    return None


def answer_values(answer: str, golds: Sequence[str], question: str = "") -> list[str] | None:
    """The distinct values of the golds' shape in `answer` that are not in `question`, lowercased, in order of
    appearance; None when the golds have no shape to look for (value_pattern)."""
    pattern = value_pattern(golds)
    if pattern is None:
        return None
    in_question = {v.lower() for v in pattern.findall(question)}
    found: list[str] = []
    for value in map(str.lower, pattern.findall(answer)):
        if value not in in_question and value not in found:
            found.append(value)
    return found


def other_values(answer: str, golds: Sequence[str], question: str = "") -> list[str] | None:
    """answer_values that are no gold; None when the golds have no shape to look for."""
    values = answer_values(answer, golds, question)
    return None if values is None else [v for v in values if v not in {g.lower() for g in golds}]


def first_k_score(answer: str, golds: Sequence[str], question: str = "") -> float | None:
    """The fraction of golds among the answer's first len(golds) values (answer_values); None without a shape."""
    values = answer_values(answer, golds, question)
    if values is None:
        return None
    first = set(values[: len(golds)])
    return sum(g.lower() in first for g in golds) / len(golds)


@dataclass(frozen=True)
class HedgeCounts:
    """One (row, task) cell's hedging, percentages over its n questions."""

    row: str
    task: str
    n: int
    score: float
    """The cell's score as evaluated (string_match_all x 100, mean over questions)."""
    hedged: float
    """Percent of the questions whose answer was credited (score > 0) and names another value."""
    one_value_score: float
    """The score with every hedged answer scored 0."""
    first_k_score: float
    """Mean first_k_score x 100: the answer read as its first k values."""
    other_values: float
    """Mean count of other values per answer."""


def count_hedging(row: str, traces: Sequence[dict[str, Any]], method: str = "memagent") -> list[HedgeCounts]:
    """Hedging per task of one directory's traces of `method` ("memagent" or "full-context"), for the tasks whose
    golds have a shape (sorted)."""
    by_task: dict[str, list[tuple[float, list[str], float]]] = {}
    for t in traces:
        if t.get("method", "memagent") != method:
            continue
        answer = (t.get("extracted") if t.get("extracted") is not None else t["answer"]) or ""
        others = other_values(answer, t["golds"], t.get("question", ""))
        if others is not None:
            first = first_k_score(answer, t["golds"], t.get("question", ""))
            by_task.setdefault(t["source"], []).append((float(t["score"]), others, first))
    counts = []
    for task, cells in sorted(by_task.items()):
        n = len(cells)
        hedged = [score > 0 and bool(others) for score, others, _ in cells]
        counts.append(HedgeCounts(
            row, task, n, score=100 * sum(c[0] for c in cells) / n, hedged=100 * sum(hedged) / n,
            one_value_score=100 * sum(c[0] for c, h in zip(cells, hedged) if not h) / n,
            first_k_score=100 * sum(c[2] for c in cells) / n,
            other_values=sum(len(c[1]) for c in cells) / n))
    return counts


def hedging_markdown(counts: Sequence[HedgeCounts]) -> str:
    """A table: task, row, n, score, hedged %, one-value and first-k scores, other values per answer (by task)."""
    header = ["task", "row", "n", "score", "hedged (%)", "one-value score", "first-k score", "other values / answer"]
    lines = [[c.task, c.row, str(c.n), f"{c.score:.1f}", f"{c.hedged:.1f}", f"{c.one_value_score:.1f}",
              f"{c.first_k_score:.1f}", f"{c.other_values:.1f}"] for c in sorted(counts, key=lambda c: c.task)]
    return markdown_table(header, lines)


def main(argv: list[str] | None = None) -> str:
    """Print (and return) the hedging table of the evaluate.py output directories given."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dirs", nargs="+", help="evaluate.py output directories (each with a traces.jsonl)")
    parser.add_argument("--method", default="memagent", help="the traces' method: memagent or full-context")
    args = parser.parse_args(argv)
    counts: list[HedgeCounts] = []
    for d in map(Path, args.dirs):
        if not (d / "traces.jsonl").is_file():
            raise SystemExit(f"{d}: no traces.jsonl (not an evaluate.py output directory)")
        counts += count_hedging(d.name, read_traces(d / "traces.jsonl"), args.method)
    text = hedging_markdown(counts)
    print(text)
    return text


if __name__ == "__main__":
    main()
