"""Which lenient metric scores which task, and the score of one answer.

Evaluation follows MemAgent's offline scripts (taskutils/memory_eval): the answer is first pulled out of the
response (`extract_answer`: last \\boxed{}, else the text after "the answer is", else everything), then
- RULER families (niah_*, vt, cwe, fwe) and our kv_* retrieval demos: string_match_all, the fraction of gold
  strings contained in the answer (multi-answer tasks get partial credit);
- everything else is QA-like (hotpotqa, qa_1/qa_2, one's own data): sub_exact_match, with EM and F1 reported next
  to it. MemAgent scores sub_em against the first gold only; we take the max over all golds, as SQuAD does.
  Departure: an answer that normalizes to nothing (":", "The.") scores 0. MemAgent's sub_em finds the empty string
  inside every gold and pays 1.0 (`sub_exact_match` keeps that rule, as MemAgent's reported numbers use it); a
  policy stuck in a loop such as "The answer is: The answer is:" extracts ":" and would score on every question.
A request that failed (HTTP error after retries) scores 0 on every metric and stays in the denominator.
"""

from __future__ import annotations

from dataclasses import dataclass

from memagent.verify import (
    exact_match,
    f1_score,
    is_retrieval_task,
    normalize_answer,
    string_match_all,
    sub_exact_match,
)
from memagent.verify.lenient import extract_answer

STRING_MATCH_ALL = "string_match_all"
SUB_EM = "sub_em"

def metric_for_task(task: str) -> str:
    """STRING_MATCH_ALL for RULER families and kv_* demos, SUB_EM for QA-like and unknown tasks."""
    return STRING_MATCH_ALL if is_retrieval_task(task) else SUB_EM


@dataclass(frozen=True)
class Score:
    """The lenient scores of one final answer."""

    metric: str
    """Name of the primary metric (STRING_MATCH_ALL or SUB_EM)."""
    score: float
    """Primary metric in [0, 1]; accuracy tables average this."""
    extracted: str
    """The answer part of the response that was scored."""
    em: float | None
    """Exact match after normalization (QA-like tasks only)."""
    f1: float | None
    """Token F1 after normalization (QA-like tasks only)."""


def score_answer(task: str, response: str, golds: list[str], *, failed: bool = False) -> Score:
    """Score one response against its golds with the task's metric; a failed request scores 0."""
    metric = metric_for_task(task)
    qa = metric == SUB_EM
    if failed:
        return Score(metric, 0.0, "", 0.0 if qa else None, 0.0 if qa else None)
    extracted = extract_answer(response)
    if not qa:
        return Score(metric, string_match_all(extracted, golds), extracted, None, None)
    if normalize_answer(extracted) == "":  # the departure above
        return Score(metric, 0.0, extracted, 0.0, 0.0)
    return Score(metric, sub_exact_match(extracted, golds), extracted, exact_match(extracted, golds),
                 f1_score(extracted, golds))
