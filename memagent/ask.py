"""Ask a question about your own long document with the MemAgent workflow.

    python -m memagent.ask --model DIR --document FILE --question TEXT [--chunk-tokens 5000 --memory-tokens 1024]
    python -m memagent.ask --api-base URL --api-model NAME --tokenizer DIR --document FILE --question TEXT

(`memagent-ask` once the package is installed.)

The document can have any length: it is read chunk by chunk, the memory is rewritten after each chunk (shown as
it goes, unless --quiet), and the answer comes from the final memory alone. FILE is a text file, or a JSON / JSONL
file of several documents (strings, or objects with a "text" / "content" / "context" / "document" field and an
optional "title"), joined as "Document i:" blocks the way MemAgent builds its multi-document inputs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, TextIO

from memagent.cli import run_cli
from memagent.evaluation.model_choice import add_model_args, build_evaluated_model
from memagent.records import ChatRequest, Completion
from memagent.rollout.chunking import num_chunks, tokenize_document
from memagent.rollout.gates import GATE_DECODING, GATES
from memagent.rollout.llm import LLM
from memagent.rollout.prompts import WorkflowConfig
from memagent.rollout.scheduler import run_agents
from memagent.rollout.workflow import memagent_agent
from memagent.verify.lenient import extract_answer

_TEXT_FIELDS = ("text", "content", "context", "document", "body")


def load_document(path: str | Path) -> str:
    """The text to read: a plain file as is, a JSON/JSONL file of documents as "Document i:" blocks."""
    path = Path(path)
    if not path.is_file():
        raise SystemExit(f"--document {path}: no such file")
    raw = path.read_text(encoding="utf-8")
    if path.suffix == ".jsonl":
        items: list[Any] = [json.loads(line) for line in raw.splitlines() if line.strip()]
    elif path.suffix == ".json":
        items = json.loads(raw)
        if isinstance(items, dict):  # {"documents": [...]} or one document object
            items = items.get("documents", [items])
    else:
        return raw
    if not isinstance(items, list) or not items:
        raise SystemExit(f"--document {path}: expected a non-empty list of documents")
    return "\n\n".join(f"Document {i}:\n{_document_text(item, path, i)}" for i, item in enumerate(items, start=1))


def _document_text(item: Any, path: Path, i: int) -> str:
    if isinstance(item, str):
        return item
    if isinstance(item, dict):
        for key in _TEXT_FIELDS:
            if isinstance(item.get(key), str):
                title = item.get("title")
                return f"{title}\n{item[key]}" if isinstance(title, str) and title else item[key]
    raise SystemExit(f"--document {path}: document {i} is neither a string nor an object with one of {_TEXT_FIELDS}")


class ShowMemory:
    """An LLM wrapper that prints each memory update as the workflow makes it (one sample: one request a call).

    The workflow asks for chunk 1's update, then chunk 2's, ..., then the answer, so the k-th call is chunk k's
    update while k <= num_chunks; no hook into the workflow is needed.
    """

    def __init__(self, llm: LLM, num_chunks: int, *, quiet: bool = False, out: TextIO | None = None) -> None:
        self.llm, self.tokenizer, self.num_chunks = llm, llm.tokenizer, num_chunks
        self.quiet, self.out = quiet, out  # None = sys.stdout at print time (tests swap it)
        self.calls = 0

    def complete(self, requests: list[ChatRequest]) -> list[Completion]:
        completions = self.llm.complete(requests)
        self.calls += 1
        if self.calls <= self.num_chunks and not self.quiet:
            for c in completions:
                shown = c.text if c.error is None else f"[request failed: {c.error}]"
                cut = "" if c.finished else " (cut at the memory budget)"
                print(f"--- memory after chunk {self.calls}/{self.num_chunks}{cut} ---\n{shown}\n",
                      file=self.out or sys.stdout, flush=True)
        return completions


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Answer a question about a long document with MemAgent.")
    parser.add_argument("--document", required=True, help="text file, or JSON/JSONL of documents")
    parser.add_argument("--question", required=True, help="the question to answer")
    parser.add_argument("--chunk-tokens", type=int, default=5000, help="document tokens per chunk")
    parser.add_argument("--memory-tokens", type=int, default=1024, help="memory budget (new tokens per update)")
    parser.add_argument("--answer-tokens", type=int, default=1024, help="answer budget (new tokens)")
    parser.add_argument("--section-first", action="store_true",
                        help="section before memory in the update prompt (a model trained with workflow.section_first)")
    parser.add_argument("--gates", choices=GATES, default="none",
                        help="gated memory (a model trained with workflow.gates, docs/gates.md): decisions before updates")
    parser.add_argument("--gate-decoding", choices=GATE_DECODING, default="constrained",
                        help="with --gates: sample the decision word within the grammar (constrained) or freely")
    parser.add_argument("--quiet", action="store_true", help="print only the answer")
    add_model_args(parser)
    args = parser.parse_args(argv)
    if not args.question.strip():
        parser.error("--question is empty: ask something about the document")

    document = load_document(args.document)
    if not document.strip():
        raise SystemExit(f"--document {args.document}: no text to read (empty or only whitespace)")
    evaluated = build_evaluated_model(args)
    config = WorkflowConfig(chunk_tokens=args.chunk_tokens, memory_tokens=args.memory_tokens,
                          answer_tokens=args.answer_tokens, max_chunks=None, section_first=args.section_first,
                          gates=args.gates, gate_decoding=args.gate_decoding)
    ids = tokenize_document(document, evaluated.tokenizer)  # once: counted here, read by the agent below
    total = num_chunks(len(ids), config.chunk_tokens)
    if not args.quiet:
        print(f"reading {total} chunk(s) of {config.chunk_tokens} tokens with {evaluated.name}\n", flush=True)
    llm = ShowMemory(evaluated.llm, total, quiet=args.quiet)
    agent = memagent_agent(args.question, ids, evaluated.tokenizer, config, keep_prompt_ids=False)
    [result] = run_agents([agent], llm)
    if result.error is not None:
        print(f"failed: {result.error}", file=sys.stderr)
        return 1
    if not args.quiet:
        print("--- answer ---")
    print(result.answer)
    if not args.quiet:
        print(f"\nextracted answer: {extract_answer(result.answer)}")
    return 0


def cli() -> None:
    """`memagent-ask` and `python -m memagent.ask`: main() with one-line user errors."""
    run_cli(main)


if __name__ == "__main__":
    cli()
