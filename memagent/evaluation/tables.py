"""Aggregate per-sample trace records into the accuracy table: one row per (method, task, length).

Scores are means of the per-sample primary metric, times 100 (RULER and MemAgent report percentages). Failed
requests are counted in `n` with score 0 and reported in `failed`, never dropped from the denominator. Length is
shown both as the document tokens the set was built for and as the mean number of chunks the workflow read.

Cost columns (MemAgent rows; docs/gates.md): chunks read, memory tokens and generated tokens per sample and per
correct answer (over the summed scores), and with gated memory the share of each decision over all updates (an
unparsed decision acts as UPDATE: it is in the update share and reported alone too). Traces written before these
fields existed, the baseline's, and an HTTP backend's token counts give None.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from memagent.rollout.gates import ANSWER_NOW, DECISIONS, KEEP, UNPARSED, UPDATE


@dataclass(frozen=True)
class ResultRow:
    """Accuracy of one method on one task at one length."""

    method: str
    """"memagent" or "full-context"."""
    source: str
    """Task name or data-file stem."""
    length: int
    """Document tokens the samples were built for (measured when the file did not say)."""
    chunks: float
    """Mean chunks per document at the run's chunk size (the workflow reads this many)."""
    n: int
    """Samples scored, failures included."""
    failed: int
    """Samples whose requests failed (scored 0)."""
    score: float
    """Mean primary metric x 100 (string_match_all or sub_em)."""
    metric: str
    """Name of the primary metric."""
    em: float | None
    """Mean exact match x 100 (QA-like tasks), else None."""
    f1: float | None
    """Mean token F1 x 100 (QA-like tasks), else None."""
    seconds_per_sample: float
    """Mean wall time per sample (a batch's time split evenly over its samples)."""
    chunks_read: float | None = None
    """Mean chunks read per sample: `chunks` unless the exit gate stopped early (None: not recorded)."""
    memory_tokens: float | None = None
    """Mean response tokens that wrote memory per sample, decision tokens excluded (None: not recorded)."""
    generated_tokens: float | None = None
    """Mean generated tokens per sample, every conversation (None: not recorded)."""
    generated_tokens_per_correct: float | None = None
    """Generated tokens over the summed scores (None: not recorded, or no sample scored)."""
    keep_share: float | None = None
    """Share of KEEP among the gated updates (None without gates)."""
    update_share: float | None = None
    """Share of UPDATE, unparsed decisions included, among the gated updates (None without gates)."""
    answer_share: float | None = None
    """Share of ANSWER (exit) among the gated updates (None without gates)."""
    unparsed_share: float | None = None
    """Share of unparsed decisions among the gated updates (None without gates)."""


def aggregate(records: Iterable[dict[str, Any]]) -> list[ResultRow]:
    """Rows sorted by source, length, then method, so the methods of one set sit side by side."""
    groups: dict[tuple[str, str, int], list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        groups[(r["method"], r["source"], int(r["length"]))].append(r)
    rows = []
    for (method, source, length), group in sorted(groups.items(), key=lambda item: _set_then_method(item[0])):
        n = len(group)
        qa = group[0]["em"] is not None
        rows.append(ResultRow(
            method=method,
            source=source,
            length=length,
            chunks=sum(r["num_chunks"] for r in group) / n,
            n=n,
            failed=sum(bool(r["error"]) for r in group),
            score=100.0 * sum(r["score"] for r in group) / n,
            metric=group[0]["metric"],
            em=100.0 * sum(r["em"] for r in group) / n if qa else None,
            f1=100.0 * sum(r["f1"] for r in group) / n if qa else None,
            seconds_per_sample=sum(r["wall_s"] for r in group) / n,
            **cost_means(group),
        ))
    return rows


def cost_means(group: list[dict[str, Any]]) -> dict[str, float | None]:
    """The cost fields of ResultRow for one group of trace records (None where a record lacks the field)."""
    def mean(key: str) -> float | None:
        values = [r.get(key) for r in group]
        return None if None in values else sum(values) / len(values)

    out = {"chunks_read": mean("chunks_read"), "memory_tokens": mean("memory_tokens"),
           "generated_tokens": mean("generated_tokens"), "generated_tokens_per_correct": None}
    scored = sum(r["score"] for r in group)
    if out["generated_tokens"] is not None and scored > 0:
        out["generated_tokens_per_correct"] = out["generated_tokens"] * len(group) / scored
    decisions = [d for r in group for d in (r.get("decisions") or [])]
    if decisions:
        share = {d: decisions.count(d) / len(decisions) for d in DECISIONS}
        out |= {"keep_share": share[KEEP], "update_share": share[UPDATE] + share[UNPARSED],
                "answer_share": share[ANSWER_NOW], "unparsed_share": share[UNPARSED]}
    return out


def format_table(rows: list[ResultRow]) -> str:
    """A Markdown table of the rows (prints well in a terminal and pastes into docs)."""
    header = ["method", "task", "tokens", "chunks", "n", "failed", "score", "metric", "EM", "F1", "s/sample"]
    lines = [header]
    for r in rows:
        lines.append([
            r.method, r.source, str(r.length), f"{r.chunks:.1f}", str(r.n), str(r.failed), f"{r.score:.2f}",
            r.metric, _maybe(r.em), _maybe(r.f1), f"{r.seconds_per_sample:.2f}",
        ])
    return markdown_table(lines[0], lines[1:])


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    """An aligned Markdown table of `rows` (each a list of cell texts) under `header`."""
    lines = [header, *rows]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    rendered = ["| " + " | ".join(cell.ljust(w) for cell, w in zip(line, widths)) + " |" for line in lines]
    rendered.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(rendered)


def format_cost_table(rows: list[ResultRow]) -> str:
    """A Markdown table of the cost columns of the rows that recorded them (MemAgent's); "" when none did."""
    header = ["method", "task", "tokens", "chunks", "read", "memory tok", "gen tok", "gen tok/correct", "keep",
              "update", "answer", "unparsed"]
    lines = [header]
    for r in rows:
        if r.chunks_read is None:
            continue
        lines.append([
            r.method, r.source, str(r.length), f"{r.chunks:.1f}", f"{r.chunks_read:.1f}", _maybe(r.memory_tokens),
            _maybe(r.generated_tokens), _maybe(r.generated_tokens_per_correct), _maybe(r.keep_share),
            _maybe(r.update_share), _maybe(r.answer_share), _maybe(r.unparsed_share),
        ])
    return markdown_table(lines[0], lines[1:]) if len(lines) > 1 else ""


def results_json(rows: list[ResultRow], config: dict[str, Any]) -> dict[str, Any]:
    """What evaluate.py writes to results.json: the run's settings, the rows, and each method's mean score."""
    by_method: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        by_method[r.method].append(r.score)
    return {
        "config": config,
        "rows": [asdict(r) for r in rows],
        "mean_score_by_method": {m: sum(s) / len(s) for m, s in by_method.items()},
    }


def _set_then_method(key: tuple[str, str, int]) -> tuple[str, int, str]:
    method, source, length = key
    return source, length, method


def _maybe(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"
