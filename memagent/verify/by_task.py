"""Which answer rule a task family takes, for training rewards and evaluation alike.

RULER-style families (niah_*, vt, cwe, fwe) and our kv_* tasks have a set of gold strings to find:
string_match_all of the extracted answer, the fraction found, so a multi-answer task gives partial credit (RULER's
metric). Everything else is QA-like: the training reward is `contained_reward` (a gold inside the extracted answer),
the evaluation sub-exact-match (memagent.evaluation.scoring).
"""

from collections.abc import Sequence

from memagent.verify.lenient import contained_reward, extract_answer
from memagent.verify.ruler import string_match_all

RETRIEVAL_PREFIXES = ("niah_", "vt", "cwe", "fwe", "kv_")
"""Prefixes of the task names whose golds are a set of strings to find, not a phrase to match."""


def is_retrieval_task(task: str) -> bool:
    """True for RULER-style and kv_* task names, False for QA-like and unknown ones."""
    return task.startswith(RETRIEVAL_PREFIXES)


def task_reward(response: str, golds: str | Sequence[str], task: str) -> float:
    """The training verifier `task`: string_match_all of extract_answer(response) for retrieval families (a value
    in [0, 1], partial credit for multi-answer tasks), contained_reward (1.0 or 0.0) for QA-like tasks."""
    if is_retrieval_task(task):
        return string_match_all(extract_answer(response), golds)
    return contained_reward(response, golds)
