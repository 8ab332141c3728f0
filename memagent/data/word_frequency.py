"""RULER aggregation tasks: common-words extraction (cwe) and frequent-words extraction (fwe).

cwe (scripts/data/synthetic/common_words_extraction.py): a shuffled numbered list "1. w 2. w ..." where
`num_common` words appear `freq_common` times and every other word `freq_uncommon` times (30 / 3 from 4K tokens
up, 6 / 1 below); the answer is the common words. RULER draws from wonderwords; we draw pseudo-words.
fwe (freq_words_extraction.py): `length // 50` random 6-letter coded words, the word of rank k appearing
int(N * k^-alpha / zeta(alpha)) times, rank 1 replaced by the noise "..."; the answer is ranks 2-4. RULER grows
N in coarse steps; we search N and then pad with "..." (rank 1, never an answer) to land on the target.
Both carry no in-context example (as in MemAgent's copy); the question is kept apart from the context.
"""

from __future__ import annotations

import math
import random
from typing import Any

from memagent.data.length import Stream, TokenCounter, check_length, closest_count, largest_fitting
from memagent.data.words import pseudo_word, random_letters, sample_rng
from memagent.records import Sample

FWE_NOISE = "..."
"""RULER's rank-1 fwe word: the most frequent, and excluded from the answer."""


def _numbered(words: list[str]) -> list[str]:
    """Counting pieces of "1. a 2. b ...": numbers and words apart, so cached counts serve every probe."""
    pieces: list[str] = []
    for i, word in enumerate(words, 1):
        pieces += [f"{i}." if i == 1 else f" {i}.", f" {word}"]
    return pieces


def generate_cwe(
    tokenizer: Any,
    *,
    length: int,
    num_samples: int,
    seed: int,
    num_common: int = 10,
    freq_common: int | None = None,
    freq_uncommon: int | None = None,
) -> list[Sample]:
    """Common-words samples of `length` tokens; frequencies default to RULER's (30/3, or 6/1 below 4096)."""
    freq_c = freq_common if freq_common is not None else (30 if length >= 4096 else 6)
    freq_u = freq_uncommon if freq_uncommon is not None else (3 if length >= 4096 else 1)
    if not freq_c > freq_u >= 1 or num_common < 1:
        raise ValueError(
            f"cwe: need freq_common > freq_uncommon >= 1 and num_common >= 1, got {freq_c}, {freq_u}"
        )
    counter = TokenCounter(tokenizer)
    samples = []
    for index in range(num_samples):
        common, context, measured = _cwe_context(
            counter, sample_rng("cwe", seed, index), length, num_common, freq_c, freq_u
        )
        question = (
            "The text is a numbered list of words; some words appear more often than the others. Memorize the "
            f"most frequent ones.\nQuestion: What are the {num_common} most common words in the list?"
        )
        prefix = f" Answer: The top {num_common} words that appear most often in the list are:"
        samples.append(Sample(context, question, common, "cwe", index, measured, {"answer_prefix": prefix}))
    return samples


def _cwe_context(
    counter: TokenCounter, rng: random.Random, length: int, num_common: int, freq_c: int, freq_u: int
) -> tuple[list[str], str, int]:
    """(common words, context, its token count) of one cwe sample."""
    seen: set[str] = set()

    def fresh_word() -> str:
        while (word := pseudo_word(rng)) in seen:
            pass
        seen.add(word)
        return word

    vocab = Stream(fresh_word)
    common = [vocab(i) for i in range(num_common)]

    def words_of(num_uncommon: int) -> list[str]:
        return common * freq_c + [vocab(num_common + i) for i in range(num_uncommon)] * freq_u

    per_unit = freq_u * counter.total(_numbered(common[:1] * 2)[2:])
    try:
        n = closest_count(lambda m: counter.total(_numbered(words_of(m))), length, per_unit)
    except ValueError as err:
        raise ValueError(
            f"cwe: target length {length} is too small for {num_common} common words x {freq_c}: {err}; "
            "pass a longer length or a smaller num_common"
        ) from err
    words = words_of(n)
    rng.shuffle(words)
    context = " ".join(f"{i}. {w}" for i, w in enumerate(words, 1))
    measured = counter.count(context)
    check_length("cwe", measured, length)
    return common, context, measured


def zipf_counts(total: int, num_words: int, alpha: float) -> list[int]:
    """RULER fwe counts: the word of rank k (1-based) appears int(total * k^-alpha / zeta(alpha)) times."""
    zeta = math.pi**2 / 6 if alpha == 2.0 else sum(k**-alpha for k in range(1, 100_000))
    return [int(total * k**-alpha / zeta) for k in range(1, num_words + 1)]


def generate_fwe(
    tokenizer: Any, *, length: int, num_samples: int, seed: int, alpha: float = 2.0
) -> list[Sample]:
    """Frequent-words samples of `length` tokens; the answers are the coded words of ranks 2, 3 and 4."""
    if alpha <= 1.0:
        raise ValueError(f"fwe: alpha must be > 1 (zeta diverges), got {alpha}")
    counter = TokenCounter(tokenizer)
    num_words = max(length // 50, 5)
    samples = []
    for index in range(num_samples):
        vocab, context, measured = _fwe_context(
            counter, sample_rng("fwe", seed, index), length, num_words, alpha
        )
        question = (
            "The text is a sequence of coded words. Track how often each coded word appears, ignoring the dots "
            f"'{FWE_NOISE}'.\nQuestion: What are the three most frequent coded words in the text?"
        )
        prefix = " Answer: According to the coded text, the three most frequent words are:"
        samples.append(
            Sample(context, question, vocab[1:4], "fwe", index, measured, {"answer_prefix": prefix})
        )
    return samples


def _fwe_context(
    counter: TokenCounter, rng: random.Random, length: int, num_words: int, alpha: float
) -> tuple[list[str], str, int]:
    """(vocabulary by rank, context, its token count) of one fwe sample."""
    coded: set[str] = set()
    while len(coded) < num_words - 1:
        coded.add(random_letters(rng, 6))
    vocab = [FWE_NOISE] + rng.sample(sorted(coded), num_words - 1)
    word_tokens = [counter.total([" " + w]) for w in vocab]

    def count_of(total: int) -> int:
        return sum(c * t for c, t in zip(zipf_counts(total, num_words, alpha), word_tokens))

    try:
        total = largest_fitting(count_of, length, sum(word_tokens) / num_words)
    except ValueError as err:
        raise ValueError(f"fwe: target length {length} is too small: {err}") from err
    counts = zipf_counts(total, num_words, alpha)
    if counts[3] <= counts[4]:
        raise ValueError(
            f"fwe: target length {length} is too small to make ranks 2-4 more frequent than rank 5"
        )
    counts[0] += (length - count_of(total)) // word_tokens[0]  # pad with noise, which is never an answer
    words = [w for w, c in zip(vocab, counts) for _ in range(c)]
    rng.shuffle(words)
    context = " ".join(words)
    measured = counter.count(context)
    check_length("fwe", measured, length)
    return vocab, context, measured
