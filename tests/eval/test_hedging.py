"""Hedged answers (memagent.evaluation.hedging): values of the golds' shape beside a credited gold, the one-value
score that charges them, and the command line over real traces.jsonl files."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from memagent.evaluation.hedging import count_hedging, first_k_score, main, other_values, value_pattern

KEY_UUID = "dbc280dd-c2fa-4c3d-a483-4543ed495e6a"
GOLD_UUID = "60305a5c-a0ed-4c68-85e7-0c181dcba146"


def test_a_credited_answer_listing_a_distractor_names_it_and_a_plain_one_names_nothing() -> None:
    golds = ["3584655"]
    listing = "soft-beacon is 3584655.\nmodern-blanket is 4593036.\nsalty-spider is 139550"
    assert other_values(listing, golds) == ["4593036"]  # the cut 6-digit run is not a 7-digit value
    assert other_values("The special magic number for soft-beacon is 3584655.", golds) == []


def test_values_the_question_names_are_keys_not_answers() -> None:
    question = f"What is the special magic uuid for {KEY_UUID} mentioned in the text?"
    answer = f"The special magic uuid for {KEY_UUID} is: {GOLD_UUID}"
    assert other_values(answer, [GOLD_UUID], question) == []
    assert other_values(answer.upper(), [GOLD_UUID], question) == []  # containment ignores case, as RULER's
    assert other_values(answer, ["11111111-2222-3333-4444-555555555555"], question) == [GOLD_UUID]


def test_first_k_credits_the_asked_value_named_first_and_not_one_behind_a_distractor() -> None:
    assert first_k_score("soft-beacon is 3584655. modern-blanket is 4593036.", ["3584655"]) == 1.0
    assert first_k_score("the numbers are 3254340, 3584655, 4593036", ["3584655"]) == 0.0
    assert first_k_score("1111111, 1111111, 2222222, 3333333", ["1111111", "3333333"]) == 0.5  # repeats count once
    assert first_k_score("what is 9999999? 1111111", ["1111111"], question="what is 9999999?") == 1.0
    assert first_k_score("SRFUN", ["SRFUN"]) is None


def test_word_golds_have_no_shape_and_are_left_out() -> None:
    assert value_pattern(["SRFUN", "IOLZK"]) is None
    assert value_pattern(["Weltailfoia"]) is None
    assert value_pattern(["98", "SRFUN"]) is None
    assert other_values("anything 1234567", ["nirlya"]) is None


def digit_runs_reference(answer: str, golds: list[str], question: str) -> list[str]:
    """Slow and obvious: every maximal digit run of a gold's length, not a gold, not in the question, once."""
    in_question = set(re.findall(r"\d+", question))
    lengths = {len(g) for g in golds}
    found: list[str] = []
    for run in re.findall(r"\d+", answer):
        if len(run) in lengths and run not in golds and run not in in_question and run not in found:
            found.append(run)
    return found


@given(st.text(alphabet="0123456789 ab.", max_size=60), st.lists(st.text("0123456789", min_size=1, max_size=4),
       min_size=1, max_size=3), st.text(alphabet="0123456789 q", max_size=20))
def test_digit_values_match_a_plain_scan_of_digit_runs(answer: str, golds: list[str], question: str) -> None:
    assert other_values(answer, golds, question) == digit_runs_reference(answer, golds, question)


def trace(task: str, index: int, golds: list[str], answer: str, score: float, method: str = "memagent") -> dict:
    return {"source": task, "length": 512, "index": index, "method": method, "task": task, "question": "Q?",
            "golds": golds, "answer": answer, "extracted": answer, "score": score}


def test_cell_counts_match_a_hand_computation() -> None:
    traces = [
        trace("niah_multikey_2", 0, ["1111111"], "1111111", 1.0),             # committed and right
        trace("niah_multikey_2", 1, ["1111111"], "1111111 or 2222222", 1.0),  # hedged
        trace("niah_multikey_2", 2, ["1111111"], "2222222 3333333", 0.0),     # wrong: not hedged, 2 others
        trace("niah_multikey_2", 3, ["1111111"], "none", 0.0),
        trace("niah_multivalue", 0, ["1111111", "4444444"], "1111111, 5555555", 0.5),  # half credit, hedged
        trace("niah_multivalue", 1, ["1111111", "4444444"], "1111111", 0.5),
        trace("vt", 0, ["SRFUN"], "SRFUN", 1.0),                                # no shape: left out
        trace("niah_multikey_2", 4, ["1111111"], "1111111 2222222", 1.0, method="full-context"),  # other method
    ]
    multikey, multivalue = count_hedging("seed1-512", traces)
    assert (multikey.task, multikey.n, multikey.score, multikey.hedged, multikey.one_value_score) == (
        "niah_multikey_2", 4, 50.0, 25.0, 25.0)
    assert multikey.other_values == (0 + 1 + 2 + 0) / 4
    assert multikey.first_k_score == 50.0  # 1111111 leads in the first two answers
    assert (multivalue.n, multivalue.score, multivalue.hedged, multivalue.one_value_score) == (2, 50.0, 50.0, 25.0)
    assert multivalue.first_k_score == 50.0


@given(st.lists(st.tuples(st.sampled_from(["1111111", "1111111 2222222", "2222222", ""]),
                          st.sampled_from([0.0, 0.25, 1.0])), min_size=1, max_size=12))
def test_the_one_value_score_never_exceeds_the_score_and_the_gap_is_the_hedged_credit(cells) -> None:
    traces = [trace("niah_single_1", i, ["1111111"], answer, score) for i, (answer, score) in enumerate(cells)]
    [c] = count_hedging("row", traces)
    hedged_credit = 100 * sum(s for a, s in cells if s > 0 and "2222222" in a) / len(cells)
    assert c.one_value_score <= c.score
    assert abs((c.score - c.one_value_score) - hedged_credit) < 1e-9


def test_cli_prints_a_row_per_directory_and_task_and_names_a_directory_without_traces(tmp_path: Path,
                                                                                      capsys) -> None:
    run = tmp_path / "seed1-512"
    run.mkdir()
    (run / "traces.jsonl").write_text("".join(json.dumps(t) + "\n" for t in [
        trace("niah_single_1", 0, ["1111111"], "1111111 2222222", 1.0)]))
    text = main([str(run)])
    [row] = [line for line in text.splitlines() if "niah_single_1" in line]
    assert [c.strip() for c in row.strip("|").split("|")] == ["niah_single_1", "seed1-512", "1", "100.0", "100.0",
                                                              "0.0", "100.0", "1.0"]
    with pytest.raises(SystemExit, match="nothing: no traces.jsonl"):
        main([str(tmp_path / "nothing")])


@given(st.lists(st.sampled_from(["1111111", "2222222", "3333333", "11111112", " ", ", ", "x"]), max_size=12),
       st.lists(st.sampled_from(["1111111", "2222222", "3333333"]), min_size=1, max_size=3, unique=True))
def test_the_first_k_reading_never_credits_more_than_rulers_string_match_all(pieces, golds) -> None:
    from memagent.verify.ruler import string_match_all

    answer = "".join(pieces)
    assert first_k_score(answer, golds) <= string_match_all(answer, golds)
