"""MemAgent's closed-book filter: questions a model answers without the document are dropped."""

from __future__ import annotations

import pytest
import torch

from memagent.data import Sample
from memagent.evaluation.closed_book import filter_answerable_without_context
from memagent.rollout import ChatRequest, Completion, LocalLLM, SamplingParams


class FixedAnswerLLM:
    """An LLM that answers every chat with the same text: a legitimate LLM implementation for the filter,
    whose outcome is then known in advance. Records the requests it was sent."""

    def __init__(self, text: str, error: str | None = None) -> None:
        self.text, self.error = text, error
        self.requests: list[ChatRequest] = []

    def complete(self, requests: list[ChatRequest]) -> list[Completion]:
        self.requests += requests
        return [Completion(text=self.text, error=self.error) for _ in requests]


def _samples() -> list[Sample]:
    return [
        Sample("Paris is the capital. " * 5, "What is the capital of France?", ["Paris"], index=0),
        Sample("The value of key ant is 17.", "What is the value of key ant?", ["17"], index=1),
        Sample("Ada lives in Rome.", "Where does Ada live?", ["Rome", "Roma"], index=2),
    ]


@pytest.mark.parametrize("judge", ["strict", "both"])
def test_questions_answered_without_context_are_dropped(judge):
    kept, dropped = filter_answerable_without_context(
        _samples(), FixedAnswerLLM(r"I know: \boxed{Paris}"), judge=judge
    )
    assert [s.index for s in dropped] == [0] and [s.index for s in kept] == [1, 2]


def test_strict_judge_needs_the_exact_boxed_answer_while_substring_does_not():
    llm = FixedAnswerLLM(r"It might be roma, so \boxed{rome}")
    kept, dropped = filter_answerable_without_context(_samples(), llm, judge="strict")
    assert not dropped and len(kept) == 3
    kept, dropped = filter_answerable_without_context(_samples(), llm, judge="substring")
    assert [s.index for s in dropped] == [2]


def test_requests_carry_the_question_and_boxed_instruction_but_no_context():
    llm = FixedAnswerLLM("no idea")
    filter_answerable_without_context(_samples(), llm, num_tries=3, max_new_tokens=64)
    assert len(llm.requests) == 9 and all(r.max_new_tokens == 64 for r in llm.requests)
    first = llm.requests[0].messages
    assert first == (
        {"role": "user", "content": "What is the capital of France?\n\nPut your final answer in \\boxed{}."},
    )
    assert all("capital. Paris" not in r.messages[0]["content"] for r in llm.requests)


def test_a_failed_request_raises_instead_of_keeping_the_sample():
    with pytest.raises(RuntimeError, match="sample 0: the backend failed a closed-book request: timeout"):
        filter_answerable_without_context(_samples(), FixedAnswerLLM("", error="timeout"))


def test_unknown_judge_is_refused():
    with pytest.raises(ValueError, match="judge must be one of"):
        filter_answerable_without_context(_samples(), FixedAnswerLLM(""), judge="loose")


def test_a_random_tiny_model_answers_nothing_so_everything_is_kept(tiny_model, tiny_tokenizer):
    """End to end on the real local LLM: the untrained tiny model cannot know 7-digit magic numbers."""
    llm = LocalLLM(tiny_model, tiny_tokenizer, params=SamplingParams(), generator=torch.Generator().manual_seed(0))
    samples = [
        Sample("x", f"What is the special magic number for key {i}?", [f"{4821937 + i}"], index=i)
        for i in range(3)
    ]
    kept, dropped = filter_answerable_without_context(samples, llm, num_tries=2, max_new_tokens=8)
    assert kept == samples and dropped == []
