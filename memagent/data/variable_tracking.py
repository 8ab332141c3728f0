"""RULER variable tracking (vt): follow a chain of assignments "VAR X = 12345", "VAR Y = VAR X", ... through noise.

RULER (scripts/data/synthetic/variable_tracking.py) writes each chain's lines in order at sorted random
positions of the noise haystack and asks for every variable holding the chain's value; the default task is one
chain of 4 hops (5 variables). The value appears only in the first line, so a chunked reader must keep the
growing set of aliases in memory. Like MemAgent's copy we prepend no in-context example, and keep the question
apart from the context. Extra chains (`num_chains` > 1) are distractors with their own values.
"""

from __future__ import annotations

from typing import Any

from memagent.data.length import Stream, TokenCounter, fit_haystack
from memagent.data.words import NOISE_LINE, random_letters, sample_rng
from memagent.records import Sample


def chain_lines(names: list[str], value: int) -> list[str]:
    """One chain: the first variable gets the value, each next one the previous variable."""
    return [f"VAR {names[0]} = {value}"] + [f"VAR {b} = VAR {a}" for a, b in zip(names, names[1:])]


def generate_vt(
    tokenizer: Any, *, length: int, num_samples: int, seed: int, num_chains: int = 1, num_hops: int = 4
) -> list[Sample]:
    """Variable-tracking samples of `length` tokens; the answers are the num_hops + 1 names of the first chain."""
    if num_chains < 1 or num_hops < 1:
        raise ValueError(f"vt: need num_chains >= 1 and num_hops >= 1, got {num_chains} and {num_hops}")
    counter = TokenCounter(tokenizer)
    samples = []
    for index in range(num_samples):
        rng = sample_rng("vt", seed, index)
        names: set[str] = set()
        while len(names) < num_chains * (num_hops + 1):
            names.add(random_letters(rng, 5, upper=True))
        ordered = sorted(names)
        rng.shuffle(ordered)
        values = rng.sample(range(10_000, 100_000), num_chains)
        needles: list[str] = []
        depths: list[float] = []
        for c in range(num_chains):
            chain = ordered[c * (num_hops + 1) : (c + 1) * (num_hops + 1)]
            needles += chain_lines(chain, values[c])
            depths += sorted(rng.random() for _ in chain)
        fitted = fit_haystack(counter, length, Stream(lambda: NOISE_LINE), needles, depths, task="vt")
        answers = ordered[: num_hops + 1]
        question = (
            "Memorize and track the chain(s) of variable assignments hidden in the text.\n"
            f"Question: Find all variables that are assigned the value {values[0]} in the text."
        )
        prefix = (
            " Answer: According to the chain(s) of variable assignments in the text, "
            f"{len(answers)} variables are assigned the value {values[0]}, they are: "
        )
        samples.append(
            Sample(fitted.context, question, answers, "vt", index, fitted.length, {"answer_prefix": prefix})
        )
    return samples
