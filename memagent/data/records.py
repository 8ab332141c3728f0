"""The record every task generator produces and every reader returns."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Sample:
    """One long-context question. The document (`context`) is kept apart from the question (`question`), as in
    MemAgent's data: the agent shows the question at every chunk and streams the context chunk by chunk."""

    context: str
    """The long document."""
    question: str
    """The question (MemAgent's `input`), shown as <problem> in every prompt."""
    answers: list[str]
    """Gold answer strings (all of them are required for RULER multi-answer tasks)."""
    task: str = ""
    """Task family, e.g. "niah_single_1", "kv_retrieval", "hotpotqa"."""
    index: int = 0
    """Position of the sample in its data set."""
    length: int = 0
    """Token length of the context under the tokenizer it was generated for (0 when unknown)."""
    extra: dict[str, object] = field(default_factory=dict)
    """Format-specific fields kept for round-trips (e.g. num_docs, data_source)."""
