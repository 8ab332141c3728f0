r"""The training reward: exact match of the last `\boxed{...}` against a gold answer (docs/workflow.md, Verifiers).

Rule: take the last box of the response (`extract_boxed`), trim surrounding whitespace of it and of each gold,
and score 1.0 if it equals any gold exactly, case-sensitively; else 0.0. No box scores 0.0.

This is deliberately stricter than MemAgent's `hotpotqa.compute_score`, which lowercases both sides, looks only
at the last 300 characters and applies the MATH `strip_string` rewrites (deleting every space, `\left`, `\%`, ...).
Ours keeps case and inner spaces, so "new york city" does not match "New York City": the policy is rewarded
only for reproducing the gold string. What both share: no article or punctuation removal ("The Beatles" does not
match "Beatles"), and a `\boxed{\text{Paris}}` wrapper is not unwrapped.
"""

from collections.abc import Sequence

from memagent.verify.checks import as_str_list, require_str
from memagent.verify.extract import extract_boxed


def strict_reward(response: str, golds: str | Sequence[str]) -> float:
    r"""1.0 if the last `\boxed{...}` of `response`, trimmed, equals a trimmed gold exactly; else 0.0.

    response: the model's final answer text.
    golds: one gold answer or a non-empty sequence of them (the score is the max over them).
    """
    require_str(response, "response")
    gold_list = as_str_list(golds, "golds")
    boxed = extract_boxed(response)
    if boxed is None:
        return 0.0
    answer = boxed.strip()
    return 1.0 if any(answer == gold.strip() for gold in gold_list) else 0.0
