"""An offline HotpotQA-like bridge task: two gold documents among distractor documents.

RULER's qa_2 and MemAgent's RULER-HotpotQA (taskutils/memory_data/processing.py) put a question's gold
paragraphs among random paragraphs of the HotpotQA pool, rendered "Document {i}:\n{title}\n{text}" and joined
by blank lines; that pool is a download. Here the facts are synthetic: "<person> lives in <city>." in the
person's document and "<city> is in <country>." in the city's, asked as the bridge question "Which country does
<person> live in?". Distractor documents describe other people and cities with the same sentence shapes, and
every name is fresh within a sample, so exactly one chain answers the question. When the city's document comes
first, a chunked reader cannot yet know it matters: memory must keep candidates.
"""

from __future__ import annotations

import random
from typing import Any

from memagent.data.length import Stream, TokenCounter, fit_haystack
from memagent.data.words import NameSource, sample_rng
from memagent.records import Sample

TASK = "hotpotqa_synth"
JOBS = ("baker", "teacher", "pilot", "farmer", "painter", "doctor", "sailor", "writer", "tailor", "miner")
FEATURES = ("bridges", "markets", "gardens", "towers", "harbors", "festivals", "museums", "orchards")


def person_doc(rng: random.Random, person: str, city: str) -> str:
    """A person's document: title line, then where they live among two other facts, in random order."""
    facts = [
        f"{person} lives in {city}.",
        f"{person} works as a {rng.choice(JOBS)}.",
        f"{person} was born in {rng.randint(1900, 2005)}.",
    ]
    rng.shuffle(facts)
    return f"{person}\n" + " ".join(facts)


def city_doc(rng: random.Random, city: str, country: str) -> str:
    """A city's document: title line, then its country among two other facts, in random order."""
    facts = [
        f"{city} is in {country}.",
        f"{city} is known for its {rng.choice(FEATURES)}.",
        f"{city} was founded in {rng.randint(1100, 1900)}.",
    ]
    rng.shuffle(facts)
    return f"{city}\n" + " ".join(facts)


def doc_header(i: int) -> str:
    """The line that opens document i (1-based), as in MemAgent's and RULER's QA contexts."""
    return f"Document {i}:\n"


def _person(names: NameSource) -> str:
    return f"{names.take()} {names.take()}"


def _distractor_source(names: NameSource) -> Stream:
    """Distractor documents about fresh people and fresh cities, half of each, drawn with `names.rng`."""
    rng = names.rng

    def draw() -> str:
        if rng.random() < 0.5:
            return person_doc(rng, _person(names), names.take())
        return city_doc(rng, names.take(), names.take("ia"))

    return Stream(draw)


def generate_hotpotqa_synth(tokenizer: Any, *, length: int, num_samples: int, seed: int) -> list[Sample]:
    """Bridge questions whose document lists have `length` tokens; extra["num_docs"] counts the documents and
    extra["bridge"] names the city, the answer of the first hop (memagent.evaluation.memory_errors --bridge)."""
    counter = TokenCounter(tokenizer)
    samples = []
    for index in range(num_samples):
        rng = sample_rng(TASK, seed, index)
        names = NameSource(rng)
        person, city, country = _person(names), names.take(), names.take("ia")
        gold = [person_doc(rng, person, city), city_doc(rng, city, country)]
        depths = [rng.random(), rng.random()]
        distractors = _distractor_source(NameSource(sample_rng(TASK, seed, index, "distractors"), names.used))
        fitted = fit_haystack(
            counter, length, distractors, gold, depths, task=TASK, sep="\n\n", header=doc_header
        )
        extra: dict[str, object] = {"num_docs": fitted.num_units, "bridge": city}
        question = f"Which country does {person} live in?"
        samples.append(Sample(fitted.context, question, [country], TASK, index, fitted.length, extra))
    return samples
