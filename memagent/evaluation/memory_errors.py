"""Where a MemAgent answer's golds went: answered, kept in the memory but left out of the answer, written to the
memory and overwritten later, or never written at all (docs/evaluation.md, "What the memory learned").

MemAgent's memory is the only path from a chunk to the answer (arXiv 2507.02259, Sec. 3), so a gold missing from the
answer was lost at one of three places, which `gold_fate` tells apart from a trace's memory after every chunk:

    answered            the gold is in the extracted answer
    kept, not answered  in the final memory, not in the answer: the answer round dropped it
    lost                in some memory, not the final one: a later update overwrote it
    never kept          in no memory: the update that read its chunk did not write it down

Containment ignores case, as RULER's string_match_all (memagent.verify.ruler). A RULER-style task asks for every
gold, so each gold gets its own fate; a QA task's golds are aliases of one answer, so the question gets the best
fate of any alias (answered first, never kept last). For QA the answered fate is containment, a little looser than
the table's sub-exact-match.

    python -m memagent.evaluation.memory_errors runs/mix-eval/untrained-512 runs/mix-eval/seed0-512
    python -m memagent.evaluation.memory_errors runs/mix-eval/untrained-512 runs/mix-eval/seed0-512 \\
        --show niah_multikey_2:3          # one question's memories and answers, row by row
    python -m memagent.evaluation.memory_errors runs/mix-eval/baseline-512 runs/mix-eval/seed0-512 --bridge

`--bridge` asks the same of hotpotqa_synth's first hop: the fates of the bridge city (where the person lives; the
gold is that city's country), so a row that answers with the city tells "one hop made, the second missed" from
"nothing found". The traces do not hold the city: each directory's questions are regenerated from its
run_config.json (the model's tokenizer, data seed and length, as evaluate.py generated them). A row without
memories (the full-context baseline) has only two fates: answered, or never kept (not in the answer).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memagent.data import make_task
from memagent.evaluation.mix_scores import read_traces
from memagent.evaluation.tables import markdown_table
from memagent.model.loading import load_tokenizer
from memagent.verify import is_retrieval_task

ANSWERED, NOT_ANSWERED, LOST, NEVER_KEPT = "answered", "kept, not answered", "lost", "never kept"
FATES = (ANSWERED, NOT_ANSWERED, LOST, NEVER_KEPT)
"""Every fate, best first."""


def gold_fate(gold: str, memories: Sequence[str], extracted: str) -> str:
    """The fate (one of FATES) of one gold string, given the memory after each chunk in reading order and the
    extracted answer."""
    g = gold.lower()
    if g in extracted.lower():
        return ANSWERED
    if memories and g in memories[-1].lower():
        return NOT_ANSWERED
    if any(g in m.lower() for m in memories):
        return LOST
    return NEVER_KEPT


def trace_fates(trace: dict[str, Any]) -> list[str]:
    """The fates of one MemAgent trace record (evaluate.py's traces.jsonl): one per gold for RULER-style tasks,
    the best alias's for QA."""
    fates = [gold_fate(g, trace["memories"], trace["extracted"]) for g in trace["golds"]]
    if is_retrieval_task(trace["task"]):
        return fates
    return [min(fates, key=FATES.index)]


@dataclass(frozen=True)
class FateCounts:
    """How many golds of one row's task met each fate."""

    row: str
    """The evaluation directory's name, e.g. seed0-512."""
    task: str
    """The task the traces came from."""
    counts: dict[str, int]
    """Golds per fate, every key of FATES present."""

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def count_fates(row: str, traces: Sequence[dict[str, Any]]) -> list[FateCounts]:
    """FateCounts per task (sorted by task) over the MemAgent traces among `traces`."""
    by_task: dict[str, dict[str, int]] = {}
    for t in traces:
        if t["method"] != "memagent":
            continue
        counts = by_task.setdefault(t["task"], dict.fromkeys(FATES, 0))
        for fate in trace_fates(t):
            counts[fate] += 1
    return [FateCounts(row, task, by_task[task]) for task in sorted(by_task)]


BRIDGE_TASK = "hotpotqa_synth"
"""The task whose samples name a bridge (memagent.data.hotpot: extra["bridge"])."""


def bridge_cities(run_config: dict[str, Any], length: int, count: int) -> dict[int, str]:
    """Index -> bridge city of the first `count` hotpotqa_synth questions at `length` tokens, regenerated as the
    evaluate.py run of `run_config` (its run_config.json) generated them."""
    tokenizer = load_tokenizer(run_config["model"])
    samples = make_task(BRIDGE_TASK, tokenizer, length, count, run_config["data_seed"])
    return {s.index: str(s.extra["bridge"]) for s in samples}


def count_bridge_fates(row: str, traces: Sequence[dict[str, Any]], run_config: dict[str, Any]) -> list[FateCounts]:
    """FateCounts of the bridge city over the hotpotqa_synth traces (any method), one per length (sorted)."""
    by_length: dict[int, list[dict[str, Any]]] = {}
    for t in traces:
        if t["task"] == BRIDGE_TASK:
            by_length.setdefault(t["length"], []).append(t)
    cells = []
    for length in sorted(by_length):
        found = by_length[length]
        cities = bridge_cities(run_config, length, max(t["index"] for t in found) + 1)
        counts = dict.fromkeys(FATES, 0)
        for t in found:
            counts[gold_fate(cities[t["index"]], t["memories"] or [], t["extracted"])] += 1
        cells.append(FateCounts(row, f"{BRIDGE_TASK} bridge city", counts))
    return cells


def fates_markdown(cells: Sequence[FateCounts]) -> str:
    """One line per (task, row): the golds and the share of each fate in percent."""
    lines = [[c.task, c.row, str(c.total)] + [f"{100 * c.counts[f] / c.total:.1f}" for f in FATES]
             for c in sorted(cells, key=lambda c: c.task) if c.total]
    return markdown_table(["task", "row", "golds"] + [f"{f} (%)" for f in FATES], lines)


def show_question(dirs: Sequence[Path], task: str, index: int, width: int = 160) -> str:
    """One question's golds, then each row's memory after every chunk and its answer, cut to `width` characters."""
    out: list[str] = []
    for d in dirs:
        found = [t for t in read_traces(d / "traces.jsonl")
                 if t["method"] == "memagent" and t["task"] == task and t["index"] == index]
        if not found:
            out.append(f"## {d.name}: no MemAgent trace of {task} question {index}")
            continue
        t = found[0]
        if not out:
            out += [f"question: {t['question']}", f"golds: {t['golds']}"]
        out.append(f"## {d.name} (score {t['score']:.2f}; fates {', '.join(trace_fates(t))})")
        out += [f"memory after chunk {k}: {m[:width]!r}" for k, m in enumerate(t["memories"])]
        out.append(f"answer: {t['answer'][:width]!r}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dirs", nargs="+", type=Path, help="evaluate.py output directories (each with traces.jsonl)")
    p.add_argument("--show", metavar="TASK:INDEX", help="print one question's memories and answers per directory")
    p.add_argument("--bridge", action="store_true",
                   help="hotpotqa_synth only: the fates of the bridge city, the first hop's answer (needs each "
                        "directory's run_config.json and its model's tokenizer)")
    args = p.parse_args(argv)
    for d in args.dirs:
        if not (d / "traces.jsonl").is_file():
            raise SystemExit(f"{d}: no traces.jsonl (pass an evaluate.py --output-dir)")
    if args.show:
        task, _, index = args.show.rpartition(":")
        if not task or not index.isdigit():
            raise SystemExit(f"--show {args.show!r}: expected TASK:INDEX, e.g. niah_multikey_2:3")
        return show_question(args.dirs, task, int(index))
    if args.bridge:
        cells = []
        for d in args.dirs:
            if not (d / "run_config.json").is_file():
                raise SystemExit(f"{d}: no run_config.json, so its questions cannot be regenerated for --bridge")
            run_config = json.loads((d / "run_config.json").read_text())
            cells += count_bridge_fates(d.name, read_traces(d / "traces.jsonl"), run_config)
        return fates_markdown(cells)
    return fates_markdown([c for d in args.dirs for c in count_fates(d.name, read_traces(d / "traces.jsonl"))])


if __name__ == "__main__":
    print(main())
