"""Closed-vocabulary key-value tasks for the tiny demo: retrieval, last-write-wins, multi-value accumulation.

A 64-hidden model with a 512-token vocabulary must learn these by RL (docs/demo.md), so everything is
small and fixed: a dozen filler words, `num_keys` three-letter key names, `value_digits`-digit values, one line
shape per task and questions of a few words. Each probes one memory skill of MemAgent's overwrite loop:
- kv_retrieval: one "The value of key K is V." line among filler; keep one fact across chunk boundaries.
- kv_last_write: K is assigned several times; the answer is the last value in reading order (overwrite).
- kv_multi_value: K has several values in different places; all are required (accumulate, never overwrite).
`num_distractors` adds lines of the same shape for other keys, so memory must also be selective.
"""

from __future__ import annotations

from typing import Any

from memagent.data.length import Stream, TokenCounter, fit_haystack
from memagent.data.words import KV_FILLER, KV_KEYS, sample_rng
from memagent.records import Sample

ASSIGN = "The value of key {key} is {value}."
"""Line shape of kv_retrieval and kv_last_write."""
ONE_OF = "A value of key {key} is {value}."
"""Line shape of kv_multi_value."""


def _check(task: str, num_keys: int, value_digits: int, num_lines: int, num_distractors: int) -> None:
    if not 1 <= num_keys <= len(KV_KEYS):
        raise ValueError(f"{task}: num_keys must be in 1..{len(KV_KEYS)}, got {num_keys}")
    if num_distractors and num_keys < 2:
        raise ValueError(f"{task}: distractor lines need another key: pass num_keys >= 2")
    if value_digits < 1 or num_lines + num_distractors > 9 * 10 ** (value_digits - 1):
        raise ValueError(
            f"{task}: {value_digits}-digit values cannot give {num_lines + num_distractors} distinct ones"
        )


def _kv_samples(
    task: str,
    tokenizer: Any,
    *,
    length: int,
    num_samples: int,
    seed: int,
    num_keys: int,
    value_digits: int,
    num_lines: int,
    num_distractors: int,
    template: str,
    question: str,
    answers: slice,
    depth: float | None = None,
) -> list[Sample]:
    """Samples whose question is `question` formatted with the key, and whose answers are `answers` of the
    key's values in reading order.

    The queried key gets `num_lines` lines at sorted random depths (all at `depth` when given); distractor keys
    get one line each at random depths. All values of a sample are distinct.
    """
    _check(task, num_keys, value_digits, num_lines, num_distractors)
    counter = TokenCounter(tokenizer)
    low = 0 if value_digits == 1 else 10 ** (value_digits - 1)
    out = []
    for index in range(num_samples):
        rng = sample_rng(task, seed, index)
        keys = list(KV_KEYS[:num_keys])
        key = rng.choice(keys)
        values = [str(v) for v in rng.sample(range(low, 10**value_digits), num_lines + num_distractors)]
        depths = [depth] * num_lines if depth is not None else sorted(rng.random() for _ in range(num_lines))
        needles = [template.format(key=key, value=v) for v in values[:num_lines]]
        others = [k for k in keys if k != key]
        for v in values[num_lines:]:
            needles.append(template.format(key=rng.choice(others), value=v))
            depths.append(rng.random())
        filler_rng = sample_rng(task, seed, index, "filler")
        filler = Stream(lambda r=filler_rng: r.choice(KV_FILLER))
        fitted = fit_haystack(counter, length, filler, needles, depths, task=task)
        golds = values[:num_lines][answers]
        out.append(Sample(fitted.context, question.format(key=key), golds, task, index, fitted.length))
    return out


def generate_kv_retrieval(
    tokenizer: Any,
    *,
    length: int,
    num_samples: int,
    seed: int,
    num_keys: int = 8,
    value_digits: int = 2,
    depth: float | None = None,
    num_distractors: int = 0,
) -> list[Sample]:
    """One key-value line among filler; depth in [0, 1] places it (None: uniformly random per sample)."""
    if depth is not None and not 0.0 <= depth <= 1.0:
        raise ValueError(
            f"kv_retrieval: depth must be in [0, 1] (0 = first line, 1 = last) or None, got {depth}"
        )
    return _kv_samples(
        "kv_retrieval", tokenizer, length=length, num_samples=num_samples, seed=seed, num_keys=num_keys,
        value_digits=value_digits, num_lines=1, num_distractors=num_distractors, template=ASSIGN,
        question="What is the value of key {key}?", answers=slice(None), depth=depth,
    )  # fmt: skip


def generate_kv_last_write(
    tokenizer: Any,
    *,
    length: int,
    num_samples: int,
    seed: int,
    num_keys: int = 8,
    value_digits: int = 2,
    num_writes: int = 3,
    num_distractors: int = 0,
) -> list[Sample]:
    """A key assigned `num_writes` times at random places; the answer is the last assignment."""
    if num_writes < 2:
        raise ValueError(
            f"kv_last_write: num_writes must be >= 2 (one write is kv_retrieval), got {num_writes}"
        )
    return _kv_samples(
        "kv_last_write", tokenizer, length=length, num_samples=num_samples, seed=seed, num_keys=num_keys,
        value_digits=value_digits, num_lines=num_writes, num_distractors=num_distractors, template=ASSIGN,
        question="What is the last value of key {key}?", answers=slice(-1, None),
    )  # fmt: skip


def generate_kv_multi_value(
    tokenizer: Any,
    *,
    length: int,
    num_samples: int,
    seed: int,
    num_keys: int = 8,
    value_digits: int = 2,
    num_values: int = 3,
    num_distractors: int = 0,
) -> list[Sample]:
    """A key with `num_values` values in different places; the answers are all of them, in reading order."""
    if num_values < 2:
        raise ValueError(f"kv_multi_value: num_values must be >= 2, got {num_values}")
    return _kv_samples(
        "kv_multi_value", tokenizer, length=length, num_samples=num_samples, seed=seed, num_keys=num_keys,
        value_digits=value_digits, num_lines=num_values, num_distractors=num_distractors, template=ONE_OF,
        question="What are all the values of key {key}?", answers=slice(None),
    )  # fmt: skip
