"""Properties of the length machinery: the unit search, additive piece counts, needle placement."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memagent.data.length import (
    Stream,
    TokenCounter,
    closest_count,
    fit_haystack,
    largest_fitting,
    place,
    to_pieces,
)


@settings(max_examples=200, deadline=None)
@given(
    increments=st.lists(st.integers(0, 40), min_size=1, max_size=300),
    fixed=st.integers(0, 50),
    budget=st.integers(0, 3000),
    hint=st.floats(0.1, 100.0),
)
def test_largest_fitting_returns_the_largest_n_within_budget(increments, fixed, budget, hint):
    """For any nondecreasing count (here: a fixed part plus per-unit increments), the search agrees with a scan."""
    increments = [*increments, 1]  # counts must eventually grow past any budget

    def count_of(n: int) -> int:
        return fixed + sum(increments[:n]) + max(0, n - len(increments))

    if fixed > budget:
        with pytest.raises(ValueError, match="fixed part"):
            largest_fitting(count_of, budget, hint)
        return
    expected = max(n for n in range(len(increments) + budget + 2) if count_of(n) <= budget)
    assert largest_fitting(count_of, budget, hint) == expected


def test_closest_count_picks_the_nearer_neighbour():
    assert closest_count(lambda n: 10 * n, 26, 10.0) == 3  # 30 is nearer to 26 than 20
    assert closest_count(lambda n: 10 * n, 24, 10.0) == 2


@settings(max_examples=50, deadline=None)
@given(
    lines=st.lists(st.text(alphabet="abcdeXYZ 0123.,:-é", min_size=1, max_size=30), min_size=1, max_size=20)
)
def test_piece_counts_add_up_to_the_full_count_for_newline_pieces(tokenizer, lines):
    """Byte-level BPE never merges across a newline, so summing cached piece counts equals one tokenization."""
    lines = [line.strip(" ") or "x" for line in lines]
    counter = TokenCounter(tokenizer)
    pieces = to_pieces(lines, "\n", None)
    assert counter.total(pieces) == counter.count("".join(pieces))


def test_token_counter_accepts_a_counting_function():
    counter = TokenCounter(lambda text: len(text.split()))
    assert counter.total(["a b\n", "c\n", "d"]) == counter.count("a b\nc\nd") == 4


def test_token_counter_rejects_an_object_that_cannot_count():
    with pytest.raises(TypeError, match="cannot count tokens with int"):
        TokenCounter(3)


def test_place_inserts_needles_at_their_depths_and_keeps_list_order_on_ties():
    units = place(4, lambda i: f"f{i}", ["a", "b", "c", "d"], [0.0, 1.0, 0.5, 0.5])
    assert units == ["a", "f0", "f1", "c", "d", "f2", "f3", "b"]


def test_stream_units_do_not_depend_on_how_many_are_drawn():
    draws = iter(range(100))
    stream = Stream(lambda: str(next(draws)))
    assert [stream(3), stream(0), stream(3)] == ["3", "0", "3"]


def test_fit_haystack_lands_within_a_token_and_reports_the_full_count(tokenizer):
    counter = TokenCounter(tokenizer)
    fitted = fit_haystack(counter, 777, Stream(lambda: "the sun is up."), ["KEY 12"], [0.5], task="t")
    assert fitted.length == counter.count(fitted.context)
    assert abs(fitted.length - 777) <= 2
    assert "KEY 12" in fitted.context.split("\n")


def test_fit_haystack_names_the_task_when_the_needles_do_not_fit(tokenizer):
    with pytest.raises(ValueError, match="mytask: target length 5 is too small"):
        fit_haystack(
            TokenCounter(tokenizer), 5, Stream(lambda: "x"), ["a long needle line " * 5], [0.0], task="mytask"
        )
