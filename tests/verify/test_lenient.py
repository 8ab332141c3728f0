"""extract_answer, lenient_reward and contained_reward: box first, else after the last "the answer is", else everything."""

import doctest
from collections.abc import Sequence

import pytest

import memagent.verify.lenient
from memagent.verify import contained_reward, lenient_reward
from memagent.verify.lenient import extract_answer

EXTRACT_CASES = [
    # (id, response, expected answer)
    ("box_verbatim", "\\boxed{ x }", " x "),
    ("box_beats_marker", r"the answer is Paris \boxed{Lyon}", "Lyon"),
    ("marker_bold_and_dot", "Thus the answer is **Paris**.", "Paris"),
    ("marker_any_case", "THE ANSWER IS Paris", "Paris"),
    ("last_marker", "The answer is Lyon. Actually the answer is Paris", "Paris"),
    ("dot_inside_bold", "the answer is **Paris.**", "Paris"),
    ("trailing_newline", "the answer is Paris.\n", "Paris"),
    ("one_trailing_dot_only", "the answer is Paris..", "Paris."),
    ("inner_dot_kept", "the answer is 3.14", "3.14"),
    ("colon_not_stripped", "The answer is: Paris", ": Paris"),
    ("nothing_after_marker", "so the answer is", ""),
    ("unbalanced_box_falls_back_to_marker", r"the answer is Paris \boxed{Ly", r"Paris \boxed{Ly"),
    ("no_marker_whole_response", "  I think Paris  ", "  I think Paris  "),
]


@pytest.mark.parametrize(
    ("response", "expected"), [c[1:] for c in EXTRACT_CASES], ids=[c[0] for c in EXTRACT_CASES]
)
def test_extract_answer_tries_box_then_marker_then_whole(response: str, expected: str) -> None:
    assert extract_answer(response) == expected


REWARD_CASES = [
    # (id, response, golds, expected)
    ("box_case_insensitive", r"\boxed{paris}", "Paris", 1.0),
    ("box_article_dropped", r"\boxed{The Beatles}", "Beatles", 1.0),
    ("marker", "Therefore, the answer is Paris.", "Paris", 1.0),
    ("last_marker_wrong_gold", "The answer is Lyon. Actually the answer is Paris", "Lyon", 0.0),
    ("box_beats_marker", r"the answer is Paris \boxed{Lyon}", "Paris", 0.0),
    ("whole_response_contains_gold", "I think it's Paris, France", "Paris", 1.0),
    ("partial_prediction", r"\boxed{Par}", "Paris", 1.0),
    ("empty_after_marker", "the answer is", "Paris", 0.0),
    ("max_over_golds", r"\boxed{NYC}", ["New York", "nyc"], 1.0),
    ("wrong", r"\boxed{London}", ["Paris", "Lyon"], 0.0),
]


@pytest.mark.parametrize(
    ("response", "golds", "expected"), [c[1:] for c in REWARD_CASES], ids=[c[0] for c in REWARD_CASES]
)
def test_lenient_reward_is_sub_exact_match_of_extracted_answer(
    response: str, golds: str | Sequence[str], expected: float
) -> None:
    assert lenient_reward(response, golds) == expected


def test_lenient_reward_rejects_empty_gold_list() -> None:
    with pytest.raises(ValueError, match="golds"):
        lenient_reward("Paris", [])


@pytest.mark.parametrize(("response", "golds", "name"), [(None, "a", "response"), ("a", 5, "golds")])
def test_lenient_reward_rejects_non_strings_naming_argument(
    response: object, golds: object, name: str
) -> None:
    with pytest.raises(TypeError, match=name):
        lenient_reward(response, golds)  # type: ignore[arg-type]


def test_lenient_docstring_examples_hold() -> None:
    result = doctest.testmod(memagent.verify.lenient)
    assert result.attempted > 0 and result.failed == 0


@pytest.mark.parametrize(
    ("response", "golds", "expected"),
    [
        ("The special magic number is 4261940.", ["4261940"], 1.0),
        ("\\boxed{Paris}", ["London", "paris"], 1.0),
        ("4", ["4261940"], 0.0),  # a fragment of the gold: sub-exact-match would pay, this must not
        ("Par", "Paris", 0.0),
        ("The.", ["Paris"], 0.0),  # normalizes to "", which sub-exact-match finds inside every gold
        ("", ["Paris"], 0.0),
    ],
)
def test_contained_reward_pays_only_when_a_gold_occurs_inside_the_answer(response, golds, expected) -> None:
    assert contained_reward(response, golds) == expected


def test_sub_exact_match_pays_for_a_fragment_which_is_why_it_does_not_train() -> None:
    assert lenient_reward("4", ["4261940"]) == 1.0 and contained_reward("4", ["4261940"]) == 0.0
