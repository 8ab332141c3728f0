"""A task mix (memagent.data.mix): the entries parse or fail naming the entry, the counts split exactly by weight,
a one-task mix is that task's own data, and a mix holds every task in its share with unique indices."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from memagent.data import make_task
from memagent.data.mix import TaskShare, make_task_mix, parse_task_mix, split_counts


def test_entries_parse_to_names_and_weights_with_weight_one_by_default() -> None:
    shares = parse_task_mix(["niah_single_1:2", "vt", " fwe:0.5 "])
    assert shares == [TaskShare("niah_single_1", 2.0), TaskShare("vt", 1.0), TaskShare("fwe", 0.5)]


@pytest.mark.parametrize(("entry", "says"), [
    ("needle", "unknown task 'needle'"), ("vt:heavy", "must be a number"), ("vt:0", "> 0"), ("vt:-1", "> 0"),
    ("vt:nan", "finite"), ("vt:inf", "finite"),
])
def test_a_bad_entry_is_refused_naming_it(entry: str, says: str) -> None:
    with pytest.raises(ValueError, match=f"{entry!r}.*{says}|{says}"):
        parse_task_mix([entry])


def test_a_task_given_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="'vt' appears twice"):
        parse_task_mix(["vt", "vt:2"])


def best_split(weights: list[float], total: int) -> list[int]:
    """Slow reference: among all splits of `total` into len(weights) counts, one that minimizes the largest gap
    to the exact shares (every such split has each count within 1 of its share)."""
    exact = [total * w / sum(weights) for w in weights]
    splits = (c for c in itertools.product(range(total + 1), repeat=len(weights)) if sum(c) == total)
    return list(min(splits, key=lambda c: max(abs(x - e) for x, e in zip(c, exact))))


@given(st.lists(st.integers(1, 6), min_size=1, max_size=3), st.integers(0, 12))
def test_counts_sum_exactly_and_are_as_close_to_the_shares_as_the_best_split(weights: list[int], total: int) -> None:
    counts = split_counts(weights, total)
    exact = [total * w / sum(weights) for w in weights]
    assert sum(counts) == total
    assert all(abs(c - e) < 1 for c, e in zip(counts, exact))
    worst = max(abs(c - e) for c, e in zip(counts, exact))
    reference = best_split(weights, total)
    assert worst <= max(abs(c - e) for c, e in zip(reference, exact)) + 1e-12


def test_a_one_task_mix_is_that_tasks_own_data(tokenizer) -> None:
    alone = make_task("kv_retrieval", tokenizer, 96, 5, seed=3)
    assert make_task_mix(parse_task_mix(["kv_retrieval:7"]), tokenizer, 96, 5, seed=3) == alone


def test_a_mix_holds_each_task_in_its_share_with_unique_indices(tokenizer) -> None:
    shares = parse_task_mix(["kv_retrieval:3", "kv_last_write"])
    samples = make_task_mix(shares, tokenizer, 96, 8, seed=0)
    assert Counter(s.task for s in samples) == {"kv_retrieval": 6, "kv_last_write": 2}
    assert [s.index for s in samples] == list(range(8))


def test_an_empty_mix_is_refused(tokenizer) -> None:
    with pytest.raises(ValueError, match="data.tasks is empty"):
        make_task_mix([], tokenizer, 96, 4)


def test_a_task_that_would_get_no_questions_is_named_instead_of_dropped(tokenizer) -> None:
    with pytest.raises(ValueError, match="kv_last_write get 0 of 4 questions"):
        make_task_mix(parse_task_mix(["kv_retrieval:20", "kv_last_write"]), tokenizer, 96, 4)
