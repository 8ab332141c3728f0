r"""MemAgent's closed-book data filter: drop questions a model answers without the document.

It runs a model, so it sits with evaluation, above the rollout layer (memagent.data only generates and reads data).

MemAgent (taskutils/memory_data/filter.py, filter2.py; docs/workflow.md, Data) asks Qwen2.5-7B and -Instruct each
question with no context, twice each, and drops it when any answer is right by the strict boxed verifier or by
containing the gold answer, so that the training signal needs the document. Here one backend (any
`memagent.rollout.llm.LLM`) gets `num_tries` copies of each question in one batched call; the caller picks the
model and its sampling settings (MemAgent: temperature 1.0, top_p 0.7, 512 new tokens) when building it.
"""

from __future__ import annotations

from collections.abc import Sequence

from memagent.records import ChatRequest, Sample
from memagent.rollout.llm import LLM
from memagent.verify import strict_reward

JUDGES = ("strict", "substring", "both")
BOXED_INSTRUCTION = "Put your final answer in \\boxed{}."


def closed_book_request(question: str, max_new_tokens: int) -> ChatRequest:
    """The question alone, with MemAgent's request for a boxed answer."""
    return ChatRequest(({"role": "user", "content": f"{question}\n\n{BOXED_INSTRUCTION}"},), max_new_tokens)


def is_correct(response: str, answers: Sequence[str], judge: str) -> bool:
    """Whether `response` answers correctly: "strict" (last \boxed{} equals a gold, memagent.verify),
    "substring" (a gold appears in it, case-insensitively) or "both" (either one, MemAgent's rule)."""

    strict = judge in ("strict", "both") and strict_reward(response, list(answers)) == 1.0
    lowered = response.lower()
    substring = judge in ("substring", "both") and any(a.lower() in lowered for a in answers if a.strip())
    return strict or substring


def filter_answerable_without_context(
    samples: Sequence[Sample],
    llm: LLM,
    *,
    num_tries: int = 2,
    judge: str = "both",
    max_new_tokens: int = 512,
) -> tuple[list[Sample], list[Sample]]:
    """(kept, dropped): a sample is dropped when any of its `num_tries` closed-book answers is correct.

    Raises RuntimeError when the backend reports a failed request: an unanswered try is not evidence that the
    question needs its document, and silently keeping it would defeat the filter.
    """
    if judge not in JUDGES:
        raise ValueError(f"judge must be one of {JUDGES}, got {judge!r}")
    if num_tries < 1:
        raise ValueError(f"num_tries must be >= 1, got {num_tries}")
    requests = [closed_book_request(s.question, max_new_tokens) for s in samples for _ in range(num_tries)]
    completions = llm.complete(requests) if requests else []
    if len(completions) != len(requests):
        raise RuntimeError(
            f"the backend returned {len(completions)} completions for {len(requests)} requests"
        )
    kept: list[Sample] = []
    dropped: list[Sample] = []
    for i, sample in enumerate(samples):
        tries = completions[i * num_tries : (i + 1) * num_tries]
        for c in tries:
            if c.error is not None:
                raise RuntimeError(
                    f"sample {sample.index}: the backend failed a closed-book request: {c.error}"
                )
        answered = any(is_correct(c.text, sample.answers, judge) for c in tries)
        (dropped if answered else kept).append(sample)
    return kept, dropped
