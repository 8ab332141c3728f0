"""RULER's string-match metrics (NVIDIA/RULER scripts/eval/synthetic/constants.py), one sample at a time.

RULER reports 100 * mean over samples, rounded to 2 decimals. Here the per-sample functions return a fraction in
[0, 1] and the batch forms return the plain mean, so callers choose when to scale and round (MemAgent's copy
also rounds each sample before averaging; rounding once at the end is the more precise of the two).
- string_match_all (niah, vt, cwe, fwe): the fraction of references that occur in the prediction.
- string_match_part (qa): 1.0 if any reference occurs in the prediction.
Containment is case-insensitive via str.lower() on both sides, as upstream. RULER's post-processing of the
prediction (strip, control characters -> newline) is left to the caller: it changes containment only for
references that themselves hold control characters.
"""

from collections.abc import Callable, Sequence

from memagent.verify.checks import as_str_list, require_str


def string_match_all(prediction: str, references: str | Sequence[str]) -> float:
    """Fraction of `references` contained in `prediction`, ignoring case: a value in [0, 1]."""
    pred, refs = _lowered(prediction, references)
    return sum(ref in pred for ref in refs) / len(refs)


def string_match_part(prediction: str, references: str | Sequence[str]) -> float:
    """1.0 if any of `references` is contained in `prediction`, ignoring case, else 0.0."""
    pred, refs = _lowered(prediction, references)
    return 1.0 if any(ref in pred for ref in refs) else 0.0


def string_match_all_batch(predictions: Sequence[str], references: Sequence[Sequence[str]]) -> float:
    """Mean of string_match_all over paired samples; RULER's score is round(100 * this, 2)."""
    return _batch_mean(string_match_all, predictions, references)


def string_match_part_batch(predictions: Sequence[str], references: Sequence[Sequence[str]]) -> float:
    """Mean of string_match_part over paired samples; RULER's score is round(100 * this, 2)."""
    return _batch_mean(string_match_part, predictions, references)


def _lowered(prediction: str, references: str | Sequence[str]) -> tuple[str, list[str]]:
    pred = require_str(prediction, "prediction").lower()
    return pred, [ref.lower() for ref in as_str_list(references, "references")]


def _batch_mean(
    metric: Callable[[str, Sequence[str]], float],
    predictions: Sequence[str],
    references: Sequence[Sequence[str]],
) -> float:
    # A bare str would otherwise pass as a sequence of one-character predictions or references.
    for name, value in (("predictions", predictions), ("references", references)):
        if isinstance(value, str) or not isinstance(value, Sequence):
            raise TypeError(
                f"{name} must be a sequence with one entry per sample, got {type(value).__name__}"
            )
    if len(predictions) == 0:
        raise ValueError("predictions must not be empty")
    if len(references) != len(predictions):
        raise ValueError(f"references has {len(references)} entries but predictions has {len(predictions)}")
    return sum(metric(p, r) for p, r in zip(predictions, references)) / len(predictions)
