"""Data: offline synthetic long-context tasks (RULER families, a HotpotQA-like bridge task, the tiny demo's
key-value tasks), MemAgent / RULER file formats (MemAgent's closed-book filter is memagent.evaluation.closed_book).

Every generator returns `Sample`s whose contexts hit a target length in tokens of the given tokenizer (within
2%), seeded and reproducible; `TASKS` maps task names to generators and `make_task` calls one by name.
"""

from memagent.data.formats import read_samples, write_samples
from memagent.data.hotpot import generate_hotpotqa_synth
from memagent.data.kv import generate_kv_last_write, generate_kv_multi_value, generate_kv_retrieval
from memagent.data.length import TokenCounter
from memagent.data.niah import (
    generate_niah,
    generate_niah_multikey_2,
    generate_niah_multikey_3,
    generate_niah_multiquery,
    generate_niah_multivalue,
    generate_niah_single_1,
)
from memagent.data.rows import FORMATS
from memagent.data.tasks import DEMO_TASKS, RULER_TASKS, TASKS, make_task
from memagent.data.variable_tracking import generate_vt
from memagent.data.word_frequency import generate_cwe, generate_fwe
from memagent.records import Sample

__all__ = [
    "DEMO_TASKS",
    "FORMATS",
    "RULER_TASKS",
    "TASKS",
    "Sample",
    "TokenCounter",
    "generate_cwe",
    "generate_fwe",
    "generate_hotpotqa_synth",
    "generate_kv_last_write",
    "generate_kv_multi_value",
    "generate_kv_retrieval",
    "generate_niah",
    "generate_niah_multikey_2",
    "generate_niah_multikey_3",
    "generate_niah_multiquery",
    "generate_niah_multivalue",
    "generate_niah_single_1",
    "generate_vt",
    "make_task",
    "read_samples",
    "write_samples",
]
