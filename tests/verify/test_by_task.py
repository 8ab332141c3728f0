"""The answer rule by task family: RULER-style and kv_* tasks by string_match_all, QA-like ones by containment."""

from __future__ import annotations

import pytest

from memagent.data import TASKS
from memagent.evaluation.scoring import STRING_MATCH_ALL, metric_for_task
from memagent.verify import contained_reward, is_retrieval_task, string_match_all, task_reward
from memagent.verify.lenient import extract_answer


@pytest.mark.parametrize("task", sorted(TASKS))
def test_training_and_evaluation_put_every_task_in_the_same_family(task: str) -> None:
    assert is_retrieval_task(task) == (metric_for_task(task) == STRING_MATCH_ALL)


@pytest.mark.parametrize(("task", "response", "golds"), [
    ("niah_multivalue", "\\boxed{11, 22}", ["11", "22", "33"]), ("vt", "the answer is AB CD", ["AB", "EF"]),
    ("hotpotqa_synth", "It is Tanoia.", ["Tanoia"]), ("hotpotqa_synth", "Tan", ["Tanoia"]),
    ("my_own_qa", "Paris, France", ["paris"]),
])
def test_task_reward_is_the_familys_rule_on_the_extracted_answer(task: str, response: str, golds: list[str]) -> None:
    expected = (string_match_all(extract_answer(response), golds) if task.startswith(("niah_", "vt"))
                else contained_reward(response, golds))
    assert task_reward(response, golds, task) == expected


def test_a_multi_answer_task_earns_the_fraction_of_its_golds_found() -> None:
    assert task_reward("1111 and 3333", ["1111", "2222", "3333", "4444"], "niah_multivalue") == 0.5
