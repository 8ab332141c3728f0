"""The task lookup used by the CLI and evaluate.py: a plain dict from task name to generator function.

Every generator is called as `generate(tokenizer, *, length, num_samples, seed, **options)` and returns
`list[Sample]` whose contexts have `length` tokens (within 2%) under `tokenizer`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from memagent.data.hotpot import generate_hotpotqa_synth
from memagent.data.kv import generate_kv_last_write, generate_kv_multi_value, generate_kv_retrieval
from memagent.data.niah import (
    generate_niah_multikey_2,
    generate_niah_multikey_3,
    generate_niah_multiquery,
    generate_niah_multivalue,
    generate_niah_single_1,
)
from memagent.data.variable_tracking import generate_vt
from memagent.data.word_frequency import generate_cwe, generate_fwe
from memagent.records import Sample

TASKS: dict[str, Callable[..., list[Sample]]] = {
    "niah_single_1": generate_niah_single_1,
    "niah_multikey_2": generate_niah_multikey_2,
    "niah_multikey_3": generate_niah_multikey_3,
    "niah_multivalue": generate_niah_multivalue,
    "niah_multiquery": generate_niah_multiquery,
    "vt": generate_vt,
    "cwe": generate_cwe,
    "fwe": generate_fwe,
    "hotpotqa_synth": generate_hotpotqa_synth,
    "kv_retrieval": generate_kv_retrieval,
    "kv_last_write": generate_kv_last_write,
    "kv_multi_value": generate_kv_multi_value,
}

RULER_TASKS = ("niah_single_1", "niah_multikey_2", "niah_multikey_3", "niah_multivalue", "niah_multiquery", "vt",
               "fwe")  # fmt: skip
"""The part of MemAgent's RULER OOD list (memory_eval/run.py) that we generate offline, scored string_match_all.
niah_single_2/3 and niah_multikey_1 need downloaded essays and qa_1 needs SQuAD; multivalue and multiquery run
on the noise haystack here (niah.py)."""

DEMO_TASKS = ("kv_retrieval", "kv_last_write", "kv_multi_value")
"""The closed-vocabulary tasks the tiny demo trains on."""


def make_task(
    name: str, tokenizer: Any, length: int, num_samples: int, seed: int = 0, **options: Any
) -> list[Sample]:
    """Generate `num_samples` samples of task `name` at `length` context tokens; options go to the generator."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}: pass one of {', '.join(TASKS)}")
    if length < 1 or num_samples < 0:
        raise ValueError(f"{name}: need length >= 1 and num_samples >= 0, got {length} and {num_samples}")
    return TASKS[name](tokenizer, length=length, num_samples=num_samples, seed=seed, **options)
