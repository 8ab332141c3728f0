"""Evaluate MemAgent (and the full-context baseline) on long-context tasks: accuracy by task and length.

    python evaluate.py --model DIR --data FILE [FILE ...] --output-dir runs/eval
    python evaluate.py --model DIR --task niah_single_1 --lengths 1024 2048 4096 --num-samples 8 --baseline both
    python evaluate.py --api-base URL --api-model NAME --tokenizer DIR --task kv_retrieval --lengths 2048

Settings follow MemAgent's offline evaluation (docs/workflow.md): chunk 5000 / memory 1024 / answer 1024 tokens,
no cap on the number of chunks, temperature 0.7 and top_p 0.95 (`--greedy` for temperature 0). Scoring is lenient
(memagent.evaluation.scoring): string_match_all for RULER families, sub-exact-match (+ EM, F1) for QA-like tasks.
`--baseline full-context` answers from the whole document in one prompt, middle-truncated to the model's window;
`--baseline both` runs both methods on the same samples. `--gates` evaluates a model trained with gated memory
(workflow.gates, docs/gates.md) in its own workflow; every MemAgent trace also records chunks read, memory and
generated tokens (and with gates the decision of each update), and the table's cost columns average them.

Outputs in --output-dir: traces.jsonl (one line per sample and method: question, memory after every chunk, answer,
gold, score), results.json (the table), and with --plot a PNG of score and time versus length. A run that is killed
resumes where it stopped: finished samples are read back from traces.jsonl and skipped, a cut-off last line is
dropped, and a MemAgent question that was in flight goes on from its last memory update, kept in inflight.jsonl
(memagent.evaluation.inflight; deleted once every sample is done), so a stop loses at most one round. Sampling is
seeded once per run, so a resumed run draws different (equally valid) samples than an uninterrupted one would; with
--greedy both agree. A resumed question's trace says how many chunks it took from the stopped run
(`resumed_chunks`), and its wall_s counts this run's time only.

Installed (`pip install .`), the command is `memagent-evaluate`; `python evaluate.py` in a checkout runs `cli()`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from memagent.cli import run_cli
from memagent.data import TASKS, make_task, read_samples
from memagent.dirlock import OutputDirBusy, lock_output_dir
from memagent.evaluation.baseline import full_context_prompt
from memagent.evaluation.inflight import InflightFile
from memagent.evaluation.model_choice import EvaluatedModel, add_model_args, build_evaluated_model
from memagent.evaluation.plot import plot_results
from memagent.evaluation.scoring import score_answer
from memagent.evaluation.tables import aggregate, format_cost_table, format_table, results_json
from memagent.evaluation.traces import BUSY_STATUS, TraceFile, TraceKey
from memagent.model.loading import weights_fingerprint
from memagent.progress import progress_bar
from memagent.records import Sample, Trajectory
from memagent.rollout.chunking import num_chunks, tokenize_document
from memagent.rollout.gates import GATE_DECODING, GATES
from memagent.rollout.prompts import WorkflowConfig
from memagent.rollout.workflow import run_memagent

MEMAGENT, FULL_CONTEXT = "memagent", "full-context"
METHODS = {"none": [MEMAGENT], "full-context": [FULL_CONTEXT], "both": [MEMAGENT, FULL_CONTEXT]}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    data = p.add_argument_group("data: files, or generated tasks")
    data.add_argument("--data", nargs="+", default=[], help="MemAgent / RULER JSON or JSONL files")
    data.add_argument("--task", nargs="+", default=[], choices=list(TASKS), metavar="NAME",
                      help=f"task names to generate: {', '.join(TASKS)}")
    data.add_argument("--lengths", nargs="+", type=int, default=[], help="document tokens per generated task set")
    data.add_argument("--num-samples", type=int, default=8, help="samples per generated (task, length)")
    data.add_argument("--data-seed", type=int, default=0, help="seed of the task generator")
    data.add_argument("--limit", type=int, default=None, help="use only the first N samples of each set")
    wf = p.add_argument_group("workflow budgets (paper defaults)")
    wf.add_argument("--chunk-tokens", type=int, default=5000)
    wf.add_argument("--memory-tokens", type=int, default=1024)
    wf.add_argument("--answer-tokens", type=int, default=1024)
    wf.add_argument("--section-first", action="store_true",
                    help="section before memory in the update prompt (a model trained with workflow.section_first)")
    wf.add_argument("--gates", choices=GATES, default="none",
                    help="gated memory (a model trained with workflow.gates, docs/gates.md): decisions before updates")
    wf.add_argument("--gate-decoding", choices=GATE_DECODING, default="constrained",
                    help="with --gates: sample the decision word within the grammar (constrained) or freely")
    run = p.add_argument_group("run")
    run.add_argument("--baseline", choices=list(METHODS), default="none",
                     help="none = MemAgent only; full-context = baseline only; both")
    run.add_argument("--window", type=int, default=None,
                     help="baseline context window in tokens (default: config max_position_embeddings)")
    run.add_argument("--batch-size", type=int, default=16,
                     help="samples in flight at once: MemAgent starts the next as one finishes; the baseline "
                          "goes batch by batch")
    run.add_argument("--output-dir", default="runs/eval", help="traces.jsonl, results.json, plot")
    run.add_argument("--plot", action="store_true", help="also plot score and time vs length (needs matplotlib)")
    add_model_args(p)
    args = p.parse_args(argv)
    if bool(args.data) == bool(args.task):
        p.error("pass either --data FILE [FILE ...] or --task NAME [NAME ...] --lengths N [N ...]")
    if args.task and not args.lengths:
        p.error("--task needs --lengths")
    counts = [("--batch-size", args.batch_size), ("--num-samples", args.num_samples), ("--limit", args.limit),
              ("--window", args.window)] + [("--lengths", n) for n in args.lengths]
    for flag, value in counts:
        if value is not None and value < 1:  # None: --limit / --window left to their defaults
            p.error(f"{flag} must be >= 1, got {value}")
    return args


# ---------------------------------------------------------------- data


@dataclass
class EvalSet:
    """Samples of one task at one length; `source` and `length` are part of every trace key."""

    source: str
    length: int
    samples: list[Sample]


def load_sets(args: argparse.Namespace, evaluated: EvaluatedModel) -> list[EvalSet]:
    sets = []
    for name in args.task:
        for length in args.lengths:
            samples = make_task(name, evaluated.tokenizer, length, args.num_samples, args.data_seed)
            sets.append(EvalSet(name, length, samples))
    for path in args.data:
        samples = read_samples(path)
        if not samples:
            raise SystemExit(f"--data {path}: no samples")
        # A file in MemAgent's format has one length bucket; when it does not record it, measure the mean.
        length = samples[0].length or round(
            sum(len(tokenize_document(s.context, evaluated.tokenizer)) for s in samples) / len(samples))
        sets.append(EvalSet(Path(path).stem, length, samples))
    for es in sets:
        es.samples = es.samples[: args.limit]
        if len({s.index for s in es.samples}) != len(es.samples):
            raise SystemExit(f"{es.source}: sample indices repeat; traces are keyed by index")
    if len({(es.source, es.length) for es in sets}) != len(sets):
        raise SystemExit("two data sets share a name and length (same file stem twice?); rename one")
    return sets


# ---------------------------------------------------------------- methods


def record(es: EvalSet, sample: Sample, method: str, *, answer: str, error: str | None, wall_s: float,
           memories: list[str] | None, memory_cut: list[bool] | None, doc_tokens: int, chunk_tokens: int,
           kept_tokens: int | None = None, cost: dict[str, Any] | None = None) -> dict[str, Any]:
    """One trace line: everything needed to rescore or inspect the sample later. cost: a MemAgent trajectory's
    `rollout_cost` fields (the baseline has none)."""
    task = sample.task or es.source
    score = score_answer(task, answer, sample.answers, failed=error is not None)
    return {
        "source": es.source, "length": es.length, "index": sample.index, "method": method, "task": task,
        "question": sample.question, "golds": sample.answers, "memories": memories, "memory_cut": memory_cut,
        "answer": answer, "extracted": score.extracted, "metric": score.metric, "score": score.score,
        "em": score.em, "f1": score.f1, "doc_tokens": doc_tokens, "num_chunks": num_chunks(doc_tokens, chunk_tokens),
        "kept_tokens": kept_tokens, "error": error, "wall_s": wall_s, **(cost or {}),
    }


def rollout_cost(t: Trajectory, gated: bool) -> dict[str, Any]:
    """What a MemAgent sample cost: chunks read, memory tokens, generated tokens (None from a text-only HTTP
    backend, which returns no token ids), and with gates each update's decision (docs/gates.md)."""
    counted = all(c.response_ids or not c.text for c in t.conversations)
    return {"chunks_read": t.num_chunks, "decisions": t.decisions if gated else None,
            "memory_tokens": t.memory_tokens_generated if counted else None,
            "generated_tokens": t.generated_tokens if counted else None}


def run_memagent_set(es: EvalSet, pending: list[Sample], evaluated: EvaluatedModel, config: WorkflowConfig,
                     in_flight: int, write: Callable[[dict[str, Any]], None], inflight: InflightFile) -> None:
    """MemAgent on `pending`, `in_flight` questions at a time, the next starting as one finishes (continuous
    batching by rounds: memagent.rollout.scheduler); each sample's record goes to `write` as it finishes, and each
    memory update to `inflight` as it is made, where a question a stopped run left in flight resumes from. A record's
    wall_s is the time since the previous sample finished (or the start): per question it is a share, not a latency,
    and a set's wall_s sum to its wall time."""
    keys = [(es.source, es.length, s.index, MEMAGENT) for s in pending]
    # copies: inflight.updates grows as this run appends to it
    resume_from = {i: list(inflight.updates[key]) for i, key in enumerate(keys) if key in inflight.updates}
    last = time.perf_counter()

    def finished(t: Trajectory) -> None:
        nonlocal last
        now = time.perf_counter()
        sample = pending[t.sample_index]
        write({**record(es, sample, MEMAGENT, answer=t.answer, error=t.error, wall_s=now - last,
                        memories=t.memories, memory_cut=t.memory_truncated, chunk_tokens=config.chunk_tokens,
                        doc_tokens=t.document_tokens, cost=rollout_cost(t, config.gated)),
               "resumed_chunks": len(resume_from.get(t.sample_index, ()))})
        last = now

    # Long documents take one round per chunk: a second bar over the conversations shows progress between samples.
    run_memagent(pending, evaluated.llm, config, keep_prompt_ids=False, show_progress=True, max_running=in_flight,
                 on_trajectory=finished, resume_from=resume_from,
                 on_update=lambda i, update: inflight.append(keys[i], update))


def run_baseline_batch(es: EvalSet, batch: list[Sample], evaluated: EvaluatedModel, config: WorkflowConfig,
                       window: int) -> list[dict]:
    start = time.perf_counter()
    prompts = [full_context_prompt(s, evaluated.tokenizer, window=window, answer_tokens=config.answer_tokens,
                                   question_tokens=config.question_tokens) for s in batch]
    completions = evaluated.llm.complete([p.request for p in prompts])
    wall = (time.perf_counter() - start) / len(batch)
    return [
        record(es, sample, FULL_CONTEXT, answer=c.text, error=c.error, wall_s=wall, memories=None,
               memory_cut=None, doc_tokens=p.document_tokens, chunk_tokens=config.chunk_tokens,
               kept_tokens=p.kept_tokens)
        for sample, p, c in zip(batch, prompts, completions)
    ]


# ---------------------------------------------------------------- resume guard


LATER_SETTINGS = {"gates": "none", "gate_decoding": "constrained"}
"""Settings added after some runs were recorded: a run_config.json without one ran with this value."""

UNRECORDED_BEFORE = frozenset({"dtype", "weights"})
"""Settings older run_config.json files did not record and whose value then is unknown: not checked there."""


def check_run_config(out: Path, current: dict[str, Any]) -> None:
    """Refuse to mix traces made with different settings into one table (resume needs the same run).

    The weights' dtype is one of them: `--dtype auto` is bfloat16 on a CPU or GPU with native bf16 and float32
    elsewhere, and greedy decoding in the two parts ways (docs/evaluation.md), so a cell started on one machine
    class is not resumed in the other's arithmetic. The weights themselves are another (their fingerprint,
    `weights_fingerprint`): a seed trained again into the same checkpoint path is another model.
    """
    path = out / "run_config.json"
    if path.exists():
        before = json.loads(path.read_text())
        changed = {k: (before.get(k, LATER_SETTINGS.get(k)), v) for k, v in current.items()
                   if not (k in UNRECORDED_BEFORE and k not in before)
                   and before.get(k, LATER_SETTINGS.get(k)) != v}
        if changed:
            hint = f" (or pass --dtype {changed['dtype'][0]} to resume in its arithmetic)" if "dtype" in changed else ""
            if "weights" in changed:
                hint += " (the weights at --model changed since the cell started: a model trained again is another model)"
            raise SystemExit(f"{out} holds traces of a run with other settings {changed} (old, new); "
                             f"use another --output-dir or delete it{hint}")
    else:
        path.write_text(json.dumps(current, indent=2))


# ---------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    config = WorkflowConfig(chunk_tokens=args.chunk_tokens, memory_tokens=args.memory_tokens,
                          answer_tokens=args.answer_tokens, max_chunks=None,  # evaluation: no truncation
                          section_first=args.section_first, gates=args.gates, gate_decoding=args.gate_decoding)
    evaluated = build_evaluated_model(args)  # after every argument check: a typo costs no model load
    methods = METHODS[args.baseline]
    window = args.window or evaluated.window
    if FULL_CONTEXT in methods and window is None:
        raise SystemExit("--baseline full-context needs --window (the model config has no max_position_embeddings)")
    sets = load_sets(args, evaluated)  # a length too short for its task fails here, before the output dir exists
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    try:
        lock = lock_output_dir(out)  # held until the results are written (or the process ends)
    except OutputDirBusy as e:
        print(e, file=sys.stderr)
        return BUSY_STATUS
    run_config = {"model": evaluated.name, "temperature": evaluated.temperature, "top_p": evaluated.top_p,
                  "seed": args.seed, "data_seed": args.data_seed, "window": window, "dtype": evaluated.dtype,
                  "weights": weights_fingerprint(args.model, args.adapter) if args.model else None, **asdict(config)}
    check_run_config(out, run_config)
    traces = TraceFile(out / "traces.jsonl")
    if traces.dropped_partial_line:
        print("traces.jsonl ended in a cut-off line (killed run): dropped it", file=sys.stderr)

    wanted: list[TraceKey] = [(es.source, es.length, s.index, m) for es in sets for s in es.samples for m in methods]
    todo = sum(key not in traces.done for key in wanted)
    print(f"{len(wanted)} (sample, method) pairs, {len(wanted) - todo} already done in {traces.path}", flush=True)
    inflight = InflightFile(out / "inflight.jsonl", finished=traces.done)
    if inflight.updates:
        print(f"{len(inflight.updates)} question(s) resume mid-document from {inflight.path} "
              f"({sum(map(len, inflight.updates.values()))} memory updates kept)", flush=True)
    bar = progress_bar(todo, "evaluate")

    def write(r: dict[str, Any]) -> None:
        traces.append(r)  # fsync'ed per sample: a kill loses at most the samples in flight
        bar.update(1)

    for es in sets:
        for method in methods:
            pending = [s for s in es.samples if (es.source, es.length, s.index, method) not in traces.done]
            if method == MEMAGENT:
                run_memagent_set(es, pending, evaluated, config, args.batch_size, write, inflight)
            else:
                for i in range(0, len(pending), args.batch_size):
                    for r in run_baseline_batch(es, pending[i : i + args.batch_size], evaluated, config, window):
                        write(r)
    bar.close()
    if set(inflight.updates) <= set(wanted):  # all finished now (a run asking for other samples may have left some)
        inflight.path.unlink(missing_ok=True)

    rows = aggregate(traces.done[key] for key in wanted)
    print(format_table(rows))
    if cost := format_cost_table(rows):
        print(cost)
    failed = sum(r.failed for r in rows)
    if failed:
        print(f"{failed} sample(s) failed at the evaluated: scored 0 and kept in n", file=sys.stderr)
    (out / "results.json").write_text(json.dumps(results_json(rows, run_config), indent=2))
    print(f"wrote {out / 'results.json'} and {traces.path}")
    if args.plot:
        try:
            print(f"wrote {plot_results(rows, out / 'score_vs_length.png')}")
        except RuntimeError as e:
            print(f"no plot: {e}", file=sys.stderr)
    lock.close()
    return 0


def cli() -> None:
    """`memagent-evaluate` and `python evaluate.py`: main() with one-line user errors, and on Ctrl-C where to resume."""
    run_cli(main, on_interrupt=lambda argv: f"finished samples are kept in {parse_args(argv).output_dir}"
            "/traces.jsonl and the questions in flight up to their last chunk in inflight.jsonl; rerun the same "
            "command to resume")


if __name__ == "__main__":
    cli()
