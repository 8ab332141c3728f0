"""Every generator hits its token length, hides recoverable answers, and is reproducible from its seed."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from memagent.data import TASKS, make_task
from memagent.data.word_frequency import FWE_NOISE

SHORT_OPTIONS = {"cwe": {"num_common": 3, "freq_common": 3}}
"""cwe's default 10 common words x 6 need ~600 tiny-tokenizer tokens; at 256 we ask for fewer."""


@pytest.mark.parametrize("length", [256, 1024, 4096])
@pytest.mark.parametrize("task", list(TASKS))
def test_context_hits_the_target_length_within_two_percent(tokenizer, task, length):
    options = SHORT_OPTIONS.get(task, {}) if length < 1024 else {}
    samples = make_task(task, tokenizer, length, 2, seed=1, **options)
    assert len(samples) == 2
    for sample in samples:
        measured = len(tokenizer(sample.context, add_special_tokens=False)["input_ids"])
        assert sample.length == measured
        assert abs(measured - length) <= 0.02 * length
        assert sample.task == task and sample.question and sample.answers


@pytest.mark.parametrize("task", list(TASKS))
def test_every_answer_is_found_in_the_context_by_string_search(tokenizer, task):
    for sample in make_task(task, tokenizer, 1024, 3, seed=2):
        assert all(answer in sample.context for answer in sample.answers), sample.answers


@pytest.mark.parametrize("task", list(TASKS))
def test_same_seed_gives_the_same_samples_and_another_seed_differs(tokenizer, task):
    first = make_task(task, tokenizer, 512 if task != "cwe" else 1024, 3, seed=7)
    again = make_task(task, tokenizer, 512 if task != "cwe" else 1024, 3, seed=7)
    other = make_task(task, tokenizer, 512 if task != "cwe" else 1024, 3, seed=8)
    assert first == again
    assert [s.context for s in first] != [s.context for s in other]
    assert len({s.context for s in first}) == 3  # samples of one set differ too


def test_sample_i_does_not_depend_on_num_samples(tokenizer):
    assert (
        make_task("niah_single_1", tokenizer, 300, 2, seed=3)
        == make_task("niah_single_1", tokenizer, 300, 4, seed=3)[:2]
    )


def test_generators_accept_a_token_counting_function():
    words = lambda text: len(text.split())  # noqa: E731
    (sample,) = make_task("niah_single_1", words, 2000, 1, seed=0)
    assert abs(len(sample.context.split()) - 2000) <= 40


def test_too_short_a_length_raises_an_error_naming_the_task(tokenizer):
    with pytest.raises(ValueError, match="cwe: target length 256 is too small"):
        make_task("cwe", tokenizer, 256, 1)
    with pytest.raises(ValueError, match="unknown task 'nope'"):
        make_task("nope", tokenizer, 256, 1)


# ---- task semantics, checked by parsing the context (no model) ------------------------------------------------


def test_kv_last_write_answer_is_the_last_assignment(tokenizer):
    for sample in make_task("kv_last_write", tokenizer, 800, 5, seed=0, num_writes=4, num_distractors=3):
        key = re.search(r"key (\w+)\?", sample.question).group(1)
        writes = re.findall(rf"^The value of key {key} is (\d+)\.$", sample.context, flags=re.M)
        assert len(writes) == 4 and len(set(writes)) == 4
        assert sample.answers == [writes[-1]]


def test_kv_multi_value_answers_are_all_values_in_reading_order(tokenizer):
    for sample in make_task("kv_multi_value", tokenizer, 800, 5, seed=0, num_values=3, num_distractors=2):
        key = re.search(r"key (\w+)\?", sample.question).group(1)
        assert sample.answers == re.findall(rf"^A value of key {key} is (\d+)\.$", sample.context, flags=re.M)


@pytest.mark.parametrize("depth", [0.0, 1.0])
def test_kv_retrieval_depth_places_the_line_first_or_last(tokenizer, depth):
    (sample,) = make_task("kv_retrieval", tokenizer, 600, 1, seed=0, depth=depth)
    lines = sample.context.split("\n")
    at = lines.index(f"The value of key {sample.question.split()[-1][:-1]} is {sample.answers[0]}.")
    # at depth 1 the line can only be followed by the (partial) filler line that closes the length gap
    assert at == 0 if depth == 0.0 else at >= len(lines) - 2


def test_kv_values_and_keys_stay_in_the_small_vocabulary(tokenizer):
    for sample in make_task("kv_retrieval", tokenizer, 600, 10, seed=0, num_keys=3, value_digits=1):
        assert sample.question.split()[-1][:-1] in {"ant", "bat", "cat"}
        assert re.fullmatch(r"\d", sample.answers[0])


def test_vt_chain_resolves_to_the_answers(tokenizer):
    for sample in make_task("vt", tokenizer, 2048, 3, seed=0, num_chains=2):
        value = int(re.search(r"value (\d+)", sample.question).group(1))
        assigned: dict[str, int] = {}
        for name, rhs in re.findall(r"^VAR (\w+) = (.+)$", sample.context, flags=re.M):
            assigned[name] = (
                int(rhs) if rhs.isdigit() else assigned[rhs.removeprefix("VAR ")]
            )  # defined earlier
        assert sorted(n for n, v in assigned.items() if v == value) == sorted(sample.answers)
        assert len(sample.answers) == 5 and len(assigned) == 10


def test_hotpot_bridge_resolves_to_the_answer(tokenizer):
    for sample in make_task("hotpotqa_synth", tokenizer, 2048, 4, seed=0):
        person = re.fullmatch(r"Which country does (.+) live in\?", sample.question).group(1)
        cities = re.findall(rf"{person} lives in (\w+)\.", sample.context)
        assert cities == [sample.extra["bridge"]]
        countries = re.findall(rf"{cities[0]} is in (\w+)\.", sample.context)
        assert countries == sample.answers
        docs = re.findall(r"^Document (\d+):$", sample.context, flags=re.M)
        assert [int(d) for d in docs] == list(range(1, sample.extra["num_docs"] + 1))


@pytest.mark.parametrize("task", ["niah_multikey_2", "niah_multikey_3"])
def test_needle_haystack_holds_the_queried_key_exactly_once(tokenizer, task):
    for sample in make_task(task, tokenizer, 2048, 3, seed=0):
        key = re.search(r"for (\S+) mentioned", sample.question).group(1)
        lines = [line for line in sample.context.split("\n") if f" for {key} is: " in line]
        assert len(lines) == 1 and lines[0].endswith(f": {sample.answers[0]}.")
        assert sample.context.count("One of the special magic") > 20  # every line is a needle


def test_niah_multiquery_and_multivalue_ask_for_four_values(tokenizer):
    (query,) = make_task("niah_multiquery", tokenizer, 1024, 1, seed=0)
    (value,) = make_task("niah_multivalue", tokenizer, 1024, 1, seed=0)
    assert len(set(query.answers)) == 4 and len(set(value.answers)) == 4
    assert query.question.count(", ") == 3 and ", and " in query.question


def test_fwe_answers_are_the_three_most_frequent_coded_words(tokenizer):
    for sample in make_task("fwe", tokenizer, 2048, 3, seed=0):
        counts = Counter(sample.context.split())
        assert counts.most_common(1)[0][0] == FWE_NOISE
        ranked = [w for w, _ in counts.most_common() if w != FWE_NOISE]
        assert set(ranked[:3]) == set(sample.answers) and counts[ranked[2]] > counts[ranked[3]]


def test_cwe_answers_are_the_common_words(tokenizer):
    for sample in make_task("cwe", tokenizer, 2048, 2, seed=0):
        words = re.findall(r"\d+\. (\S+)", sample.context)
        counts = Counter(words)
        assert {w for w, c in counts.items() if c == 6} == set(sample.answers) and len(sample.answers) == 10
        assert [int(n) for n in re.findall(r"(\d+)\. ", sample.context)] == list(range(1, len(words) + 1))
