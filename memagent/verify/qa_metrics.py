"""HotpotQA / SQuAD answer metrics on normalized text: normalize_answer, exact_match, f1_score, sub_exact_match.

These follow the official HotpotQA evaluation script (`hotpot_evaluate_v1.py`), which MemAgent's offline eval
reuses (taskutils/memory_eval/utils/__init__.py), plus MemAgent's sub-exact-match. Choices of our own:
- Every metric accepts one gold or a non-empty sequence of golds and returns the max over them (SQuAD's
  convention for several reference answers; HotpotQA has one gold per question, where the two agree).
- f1_score returns the F1 alone, not HotpotQA's (f1, precision, recall) tuple.
- Both sides normalizing to no tokens gives F1 0.0, as in HotpotQA (num_same == 0); SQuAD v2 would give 1.0.
  Exact match of two empty normalized strings is still 1.0, as in both scripts.
"""

import re
import string
from collections import Counter
from collections.abc import Sequence

from memagent.verify.checks import as_str_list, require_str

# string.punctuation is the 32 ASCII marks; Unicode punctuation such as "«", "—" or "。" is kept, as upstream.
_PUNCTUATION = str.maketrans("", "", string.punctuation)
# \b is Unicode-aware on str patterns, so only whole words go: "theory", "another" and "a1" stay.
_ARTICLES = re.compile(r"\b(a|an|the)\b")
# HotpotQA scores a mismatched yes/no/noanswer 0 even when tokens overlap (e.g. "no" vs "no answer" -> 0).
_SPECIAL_ANSWERS = frozenset({"yes", "no", "noanswer"})


def normalize_answer(s: str) -> str:
    """Lowercase, delete ASCII punctuation, drop the words a/an/the, collapse whitespace (HotpotQA order).

    Idempotent: normalize_answer(normalize_answer(s)) == normalize_answer(s).
    >>> normalize_answer("  The  Theory of  Everything!")
    'theory of everything'
    """
    require_str(s, "s")
    text = s.lower().translate(_PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, gold: str | Sequence[str]) -> float:
    """1.0 if normalize_answer(prediction) equals the normalized gold (any gold, when several), else 0.0."""
    pred = normalize_answer(require_str(prediction, "prediction"))
    return max(float(pred == normalize_answer(g)) for g in as_str_list(gold, "gold"))


def f1_score(prediction: str, gold: str | Sequence[str]) -> float:
    """Token F1 between normalized prediction and gold, HotpotQA rules; max over golds when several.

    Tokens are normalize_answer(x).split(), counted as multisets. Zero if a side normalizes to yes, no or
    noanswer and the two normalized strings differ, or if no token is shared (so also when both are empty).
    """
    pred = normalize_answer(require_str(prediction, "prediction"))
    return max(_f1_normalized(pred, normalize_answer(g)) for g in as_str_list(gold, "gold"))


def _f1_normalized(pred: str, gold: str) -> float:
    if (pred in _SPECIAL_ANSWERS or gold in _SPECIAL_ANSWERS) and pred != gold:
        return 0.0
    pred_tokens, gold_tokens = pred.split(), gold.split()
    num_same = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if num_same == 0:
        return 0.0
    precision = num_same / len(pred_tokens)
    recall = num_same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def sub_exact_match(prediction: str | None, gold: str | Sequence[str]) -> float:
    """1.0 if the normalized gold is a substring of the normalized prediction or vice versa, else 0.0.

    MemAgent's `sub_exact_match_score`, max over golds. A None prediction, or one with no non-whitespace
    character, scores 0.0 before normalizing (MemAgent scores a missing answer 0 first). Kept from MemAgent
    on purpose, because the reported RULER-HotpotQA numbers use it: a prediction that normalizes to ""
    but was not blank (e.g. "The.") is contained in every gold and scores 1.0, and "Par" matches "Paris".
    """
    gold_list = as_str_list(gold, "gold")
    if prediction is None:
        return 0.0
    if require_str(prediction, "prediction").strip() == "":
        return 0.0
    pred = normalize_answer(prediction)
    return max(float(g in pred or pred in g) for g in map(normalize_answer, gold_list))
