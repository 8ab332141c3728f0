r"""Lenient rewards: pull an answer out of free text, then score it against the golds without asking for a box.

- `lenient_reward`, the evaluation score: sub-exact-match, MemAgent's rule for its reported numbers.
- `contained_reward`, the lenient *training* reward: a normalized gold must occur inside the normalized answer.
  Sub-exact-match also pays when the answer occurs inside a gold, so a policy trained on it learns to answer a
  fragment: one digit of a 7-digit magic number is "correct" whenever the number holds that digit (seed 0 of the
  SmolLM2 run did exactly this, docs/evaluation.md). A reward one can hack that way must not train.


MemAgent's offline eval (taskutils/memory_eval/utils/__init__.py) extracts the answer either from the last
`\boxed{}` (its boxed modes) or from the text after the last "the answer is" (its default mode, whose final
prompt asks for "Therefore, the answer is ..."), then scores sub_em. We try both in a fixed order:
1. the last boxed content, if `extract_boxed` finds one;
2. else the text after the last "the answer is", matched case-insensitively (MemAgent's split is
   case-sensitive, so "The answer is X" scored 0 there; we count it), with surrounding whitespace and `*`
   (markdown bold) stripped and one trailing "." removed;
3. else the whole response.
Not done here: MemAgent's `</think>` splitting for reasoning models (a caller can cut the text first).
"""

import re
from collections import deque
from collections.abc import Sequence

from memagent.verify.checks import as_str_list, require_str
from memagent.verify.extract import extract_boxed
from memagent.verify.qa_metrics import normalize_answer, sub_exact_match

# ASCII-only case folding: under full Unicode folding "ſ" (long s) would match "s", which nobody means.
_ANSWER_IS = re.compile(r"the answer is", re.IGNORECASE | re.ASCII)


def extract_answer(response: str) -> str:
    r"""The answer part of a free-text response, by the three rules of the module docstring.

    >>> extract_answer("Reasoning... Therefore, The answer is **Paris**.")
    'Paris'
    """
    require_str(response, "response")
    boxed = extract_boxed(response)
    if boxed is not None:
        return boxed
    tail = deque(_ANSWER_IS.finditer(response), maxlen=1)  # keeps only the last match, in one pass
    if not tail:
        return response
    return _trim(_trim(response[tail[0].end() :]).removesuffix("."))


def _trim(text: str) -> str:
    """Strip leading and trailing characters that are whitespace (any Unicode space) or "*"."""
    # An index scan, not a regex: searching `[\s*]+$` restarts at every position of a long run: quadratic.
    start, end = 0, len(text)
    while start < end and (text[start] == "*" or text[start].isspace()):
        start += 1
    while end > start and (text[end - 1] == "*" or text[end - 1].isspace()):
        end -= 1
    return text[start:end]


def lenient_reward(response: str, golds: str | Sequence[str]) -> float:
    """sub_exact_match of extract_answer(response) against the golds: 1.0 or 0.0, max over golds.

    response: the model's final answer text.
    golds: one gold answer or a non-empty sequence of them.
    """
    require_str(response, "response")
    return sub_exact_match(extract_answer(response), as_str_list(golds, "golds"))


def contained_reward(response: str, golds: str | Sequence[str]) -> float:
    """1.0 if some normalized gold occurs inside the normalized extract_answer(response), else 0.0.

    response: the model's final answer text. golds: one gold answer or a non-empty sequence of them. Unlike
    `lenient_reward`, a fragment of a gold (or an answer that normalizes to "") earns nothing.
    """
    require_str(response, "response")
    answer = normalize_answer(extract_answer(response))
    return max(float(bool(gold) and gold in answer) for gold in map(normalize_answer, as_str_list(golds, "golds")))
