"""RULER needle-in-a-haystack tasks that need no download: the `noise` and `needle` haystacks.

RULER (scripts/data/synthetic/niah.py) writes k keys with v values each as needles
"One of the special magic {type} for {key} is: {value}." into a haystack, queries q of the keys and takes all
q * v values as the answer. Haystacks here: `noise` (RULER's fixed line, repeated) and `needle` (every line a
needle with a fresh random key and value, so memory must be selective). RULER runs niah_single_1 and
niah_multikey_2/3 on these; it runs multivalue and multiquery on Paul Graham essays, which need a download, so
ours are the same configurations on the noise haystack (a different, easier task; same names, for MemAgent's
evaluation list). As in MemAgent's copy of RULER, the question is kept apart from the context.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from memagent.data.length import Stream, TokenCounter, fit_haystack
from memagent.data.words import NOISE_LINE, join_and, sample_rng, seeded_uuid, seven_digit_number, word_key
from memagent.records import Sample

HAYSTACKS = ("noise", "needle")
KINDS = ("words", "numbers", "uuids")
_TYPE_NAME = {"numbers": "number", "uuids": "uuid", "words": "word"}


def _draw(rng: random.Random, kind: str) -> str:
    if kind == "words":
        return word_key(rng)
    if kind == "numbers":
        return seven_digit_number(rng)
    return seeded_uuid(rng)


def _distinct(rng: random.Random, kind: str, count: int, exclude: set[str]) -> list[str]:
    out: list[str] = []
    while len(out) < count:
        item = _draw(rng, kind)
        if item not in exclude:
            exclude.add(item)
            out.append(item)
    return out


def _needle_line_source(rng: random.Random, keys: str, values: str, avoid: list[str]) -> Callable[[], str]:
    """Draws the `needle` haystack's lines: random needles whose keys are never a real needle's key (they may
    repeat among themselves: RULER's word keys have only so many combinations)."""
    avoid_set = set(avoid)

    def draw() -> str:
        key = _draw(rng, keys)
        while key in avoid_set:
            key = _draw(rng, keys)
        return needle_text(key, _draw(rng, values), values)

    return draw


def needle_text(key: str, value: str, values: str) -> str:
    """RULER's needle sentence; `values` is the plural type ("numbers", "uuids")."""
    return f"One of the special magic {values} for {key} is: {value}."


def question_text(query: str, value_kind: str, num_answers: int) -> tuple[str, str]:
    """(question, answer_prefix) in RULER's template, singular when one value is asked for (our wording)."""
    one, many = _TYPE_NAME[value_kind], value_kind
    if num_answers == 1:
        question = (
            f"A special magic {one} is hidden in the text. Memorize it; you will be asked about the {one} "
            f"afterwards.\nWhat is the special magic {one} for {query} mentioned in the text?"
        )
        return question, f" The special magic {one} for {query} mentioned in the text is"
    question = (
        f"Some special magic {many} are hidden in the text. Memorize them; you will be asked about the {many} "
        f"afterwards.\nWhat are all the special magic {many} for {query} mentioned in the text?"
    )
    return question, f" The special magic {many} for {query} mentioned in the text are"


def generate_niah(
    tokenizer: Any,
    *,
    length: int,
    num_samples: int,
    seed: int,
    task: str = "niah",
    haystack: str = "noise",
    keys: str = "words",
    values: str = "numbers",
    num_keys: int = 1,
    num_values: int = 1,
    num_queries: int = 1,
) -> list[Sample]:
    """NIAH samples whose contexts have `length` tokens (within 2%) under `tokenizer`.

    haystack: "noise" or "needle". keys / values: "words" ({adjective}-{noun}), "numbers" (7 digits) or "uuids".
    num_keys keys are written with num_values values each, at uniformly random depths; the first num_queries
    keys are asked for, and the answers are their values, key by key. Keys, values and haystack keys never repeat.
    """
    if haystack not in HAYSTACKS or keys not in KINDS or values not in KINDS:
        raise ValueError(f"{task}: haystack must be one of {HAYSTACKS} and keys/values one of {KINDS}")
    if not 1 <= num_queries <= num_keys or num_values < 1:
        raise ValueError(f"{task}: need 1 <= num_queries <= num_keys and num_values >= 1")
    counter = TokenCounter(tokenizer)
    samples = []
    for index in range(num_samples):
        rng = sample_rng(task, seed, index)
        used: set[str] = set()
        needle_keys = _distinct(rng, keys, num_keys, used)
        needle_values = [_distinct(rng, values, num_values, used) for _ in needle_keys]
        needles = [needle_text(k, v, values) for k, vs in zip(needle_keys, needle_values) for v in vs]
        depths = [rng.random() for _ in needles]
        if haystack == "noise":
            filler = Stream(lambda: NOISE_LINE)
        else:
            filler = Stream(
                _needle_line_source(sample_rng(task, seed, index, "haystack"), keys, values, needle_keys)
            )
        fitted = fit_haystack(counter, length, filler, needles, depths, task=task)
        queries = needle_keys[:num_queries]
        answers = [v for vs in needle_values[:num_queries] for v in vs]
        question, prefix = question_text(join_and(queries), values, len(answers))
        samples.append(
            Sample(fitted.context, question, answers, task, index, fitted.length, {"answer_prefix": prefix})
        )
    return samples


def generate_niah_single_1(tokenizer: Any, *, length: int, num_samples: int, seed: int) -> list[Sample]:
    """RULER niah_single_1: noise haystack, one word key, one 7-digit number."""
    return generate_niah(tokenizer, length=length, num_samples=num_samples, seed=seed, task="niah_single_1")


def generate_niah_multikey_2(tokenizer: Any, *, length: int, num_samples: int, seed: int) -> list[Sample]:
    """RULER niah_multikey_2: every line a word-key/number needle; one of them is asked for."""
    return generate_niah(
        tokenizer,
        length=length,
        num_samples=num_samples,
        seed=seed,
        task="niah_multikey_2",
        haystack="needle",
    )


def generate_niah_multikey_3(tokenizer: Any, *, length: int, num_samples: int, seed: int) -> list[Sample]:
    """RULER niah_multikey_3: every line a uuid-key/uuid needle; one of them is asked for."""
    return generate_niah(
        tokenizer, length=length, num_samples=num_samples, seed=seed, task="niah_multikey_3",
        haystack="needle", keys="uuids", values="uuids",
    )  # fmt: skip


def generate_niah_multivalue(tokenizer: Any, *, length: int, num_samples: int, seed: int) -> list[Sample]:
    """RULER niah_multivalue on the noise haystack: one key with 4 numbers, all required."""
    return generate_niah(
        tokenizer, length=length, num_samples=num_samples, seed=seed, task="niah_multivalue", num_values=4
    )


def generate_niah_multiquery(tokenizer: Any, *, length: int, num_samples: int, seed: int) -> list[Sample]:
    """RULER niah_multiquery on the noise haystack: 4 keys with one number each, all 4 asked for."""
    return generate_niah(
        tokenizer, length=length, num_samples=num_samples, seed=seed, task="niah_multiquery",
        num_keys=4, num_queries=4,
    )  # fmt: skip
