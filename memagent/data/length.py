"""Hit a target context length in tokens of a given tokenizer, without tokenizing the context over and over.

RULER (scripts/data/synthetic/*.py) estimates tokens per unit from a sample, then binary-searches the unit count,
re-tokenizing the whole input at every probe; at 1M tokens that is minutes. We use the same idea with two
savings. (1) A context is a list of *pieces* cut at pre-tokenizer boundaries (a piece ends with its newline, a
listed word starts with its space), so its token count is the sum of its pieces' counts: byte-level BPE never
merges across such a boundary. Each distinct piece is tokenized once (cached), so a probe costs a dictionary sum.
(2) The unit count is found by secant steps inside a bracket, and a word prefix of one more filler unit closes
the last gap, so we land within a token or two of the target. One full tokenization at the end verifies the
count (and corrects it should a tokenizer not be additive, e.g. a normalizer that rewrites across pieces).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

TOLERANCE = 0.02
"""Allowed relative distance of a context's token count from its target."""


class TokenCounter:
    """Counts tokens (no special tokens) with an HF tokenizer, a `tokenizers.Tokenizer`, or a callable str -> int.

    `total(pieces)` is the cached sum over pieces; `count(text)` tokenizes one text in full.
    """

    def __init__(self, tokenizer: Any) -> None:
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None and hasattr(tokenizer, "encode_batch"):
            backend = tokenizer  # a bare tokenizers.Tokenizer
        if backend is not None:
            self._count_many: Callable[[list[str]], list[int]] = lambda texts: [
                len(e.ids) for e in backend.encode_batch(texts, add_special_tokens=False)
            ]
        elif hasattr(tokenizer, "encode"):  # a slow (pure Python) HF tokenizer
            self._count_many = lambda texts: [
                len(tokenizer.encode(t, add_special_tokens=False)) for t in texts
            ]
        elif callable(tokenizer):
            self._count_many = lambda texts: [int(tokenizer(t)) for t in texts]
        else:
            raise TypeError(
                f"cannot count tokens with {type(tokenizer).__name__}: pass a Hugging Face tokenizer, a "
                "tokenizers.Tokenizer, or a function from text to its token count"
            )
        self._cache: dict[str, int] = {}

    def count(self, text: str) -> int:
        """Tokens of `text`, tokenized in one piece."""
        return self._count_many([text])[0]

    def total(self, pieces: Sequence[str]) -> int:
        """Sum of the pieces' token counts; only pieces never seen before are tokenized (in one batch)."""
        cache = self._cache
        missing = list({p: None for p in pieces if p not in cache})
        if missing:
            cache.update(zip(missing, self._count_many(missing), strict=True))
        return sum(cache[p] for p in pieces)


def largest_fitting(count_of: Callable[[int], int], budget: int, per_unit: float) -> int:
    """The largest n >= 0 with count_of(n) <= budget, for a nondecreasing count_of.

    Secant steps from the bracket's lower end, alternated with bisection once an upper end is known, so a
    near-linear count_of takes a handful of probes. Raises ValueError when even count_of(0) exceeds the budget.
    """
    lo, c_lo = 0, count_of(0)
    if c_lo > budget:
        raise ValueError(
            f"the fixed part of the context alone takes {c_lo} tokens, more than the {budget} allowed"
        )
    hi: int | None = None
    slope = max(per_unit, 1e-9)
    step = 0
    while hi is None or hi - lo > 1:
        if step == 200:
            raise ValueError(f"no unit count reaches {budget} tokens: adding units does not add tokens")
        guess = lo + max(1, int((budget - c_lo) / slope))
        if hi is not None:
            guess = (lo + hi) // 2 if step % 3 == 2 else min(max(guess, lo + 1), hi - 1)
        c = count_of(guess)
        if guess != lo and c > c_lo:
            slope = (c - c_lo) / (guess - lo)
        if c <= budget:
            lo, c_lo = guess, c
        else:
            hi = guess
        step += 1
    return lo


def closest_count(count_of: Callable[[int], int], target: int, per_unit: float) -> int:
    """The n whose count_of(n) is nearest to `target` (the largest fitting n, or one more when that is closer)."""
    n = largest_fitting(count_of, target, per_unit)
    return n + 1 if abs(count_of(n + 1) - target) < abs(target - count_of(n)) else n


def check_length(task: str, length: int, target: int) -> None:
    """Raise RuntimeError when `length` is more than TOLERANCE away from `target`."""
    if abs(length - target) > TOLERANCE * target:
        raise RuntimeError(
            f"{task}: the context has {length} tokens, more than {TOLERANCE:.0%} from the target {target}; "
            "the tokenizer merges tokens across the context's lines or words: pass a longer length"
        )


class Stream:
    """Units drawn lazily and memoized: unit i is the same however many units are drawn afterwards."""

    def __init__(self, draw: Callable[[], str]) -> None:
        self._draw = draw
        self._units: list[str] = []

    def __call__(self, i: int) -> str:
        while len(self._units) <= i:
            self._units.append(self._draw())
        return self._units[i]


@dataclass(frozen=True)
class Fitted:
    """A context laid out to a target length."""

    context: str
    """The context text."""
    length: int
    """Its token count, from one full tokenization."""
    num_units: int
    """Units in it: fillers (a trailing partial one included) plus needles, e.g. the documents of a QA task."""


def place(
    num_fillers: int, filler: Callable[[int], str], needles: Sequence[str], depths: Sequence[float]
) -> list[str]:
    """`num_fillers` filler units with each needle inserted before filler round(depth * num_fillers).

    Needles appear in the order of their depths; equal slots keep the needles' list order (variable-tracking hops
    and last-write assignments rely on it).
    """
    slots = [round(min(max(d, 0.0), 1.0) * num_fillers) for d in depths]
    order = sorted(range(len(needles)), key=lambda j: slots[j])
    units: list[str] = []
    k = 0
    for i in range(num_fillers + 1):
        while k < len(order) and slots[order[k]] == i:
            units.append(needles[order[k]])
            k += 1
        if i < num_fillers:
            units.append(filler(i))
    return units


def to_pieces(units: Sequence[str], sep: str, header: Callable[[int], str] | None) -> list[str]:
    """Counting pieces of `sep.join(units)`, each unit prefixed with header(i) (1-based) when a header is given."""
    pieces: list[str] = []
    last = len(units) - 1
    for i, unit in enumerate(units):
        if header is not None:
            pieces.append(header(i + 1))
        pieces.append(unit + sep if i < last else unit)
    return pieces


def fit_haystack(
    counter: TokenCounter,
    target: int,
    filler: Callable[[int], str],
    needles: Sequence[str],
    depths: Sequence[float],
    *,
    task: str,
    sep: str = "\n",
    header: Callable[[int], str] | None = None,
) -> Fitted:
    """Fill a context of `target` tokens with filler units around the needles (see `place`).

    The number of whole fillers is the largest that fits; then a word prefix of the next filler is appended when
    it brings the count closer to the target. Raises ValueError when the needles alone exceed the target.
    """
    if len(needles) != len(depths):
        raise ValueError(f"{task}: {len(needles)} needles but {len(depths)} depths")
    unit_counts = [counter.total([filler(i) + sep]) for i in range(8)]
    per_unit = sum(unit_counts) / len(unit_counts) + (counter.total([header(1)]) if header else 0)

    def count_of(num_fillers: int) -> int:
        return counter.total(to_pieces(place(num_fillers, filler, needles, depths), sep, header))

    budget = target
    for _ in range(3):
        try:
            n = largest_fitting(count_of, budget, per_unit)
        except ValueError as err:
            raise ValueError(f"{task}: target length {target} is too small: {err}") from err
        units = place(n, filler, needles, depths)
        tail = _best_tail(
            counter, units, filler(n), budget - counter.total(to_pieces(units, sep, header)), sep, header
        )
        if tail:
            units.append(tail)
        context = "".join(to_pieces(units, sep, header))
        length = counter.count(context)
        if abs(length - target) <= TOLERANCE * target:
            return Fitted(context, length, len(units))
        budget += target - length  # the pieces over- or under-counted: shift the budget by the measured error
    check_length(task, length, target)
    return Fitted(context, length, len(units))


def _best_tail(
    counter: TokenCounter,
    units: list[str],
    next_unit: str,
    gap: int,
    sep: str,
    header: Callable[[int], str] | None,
) -> str:
    """The prefix of `next_unit` whose added tokens come closest to `gap` ("" when adding none is best).

    Word prefixes first; then character prefixes into the word that overshoots, since one long word (a uuid is
    ~30 tokens under a small vocabulary) can be coarser than the 2% tolerance of a short context.
    """
    if gap <= 0:
        return ""
    joint = counter.total([units[-1] + sep]) - counter.total([units[-1]]) if units else 0
    joint += counter.total([header(len(units) + 1)]) if header else 0
    best, best_miss = "", gap
    words = next_unit.split(" ")
    for k in range(1, len(words) + 1):
        prefix = " ".join(words[:k])
        added = joint + counter.total([prefix])
        if abs(gap - added) < best_miss:
            best, best_miss = prefix, abs(gap - added)
        if added > gap:
            stem = " ".join(words[: k - 1] + [""])
            for j in range(1, len(words[k - 1])):
                partial = stem + words[k - 1][:j]
                miss = abs(gap - joint - counter.total([partial]))
                if miss < best_miss:
                    best, best_miss = partial, miss
            break
    return best
