r"""strict_reward: exact, case-sensitive match of the trimmed last box against a trimmed gold (docs/workflow.md, Verifiers)."""

from collections.abc import Sequence

import pytest

from memagent.verify import strict_reward

CASES = [
    # (id, response, golds, expected)
    ("exact", r"\boxed{Paris}", "Paris", 1.0),
    ("case_sensitive", r"\boxed{paris}", "Paris", 0.0),
    ("trims_both_sides", "\\boxed{  Paris\n}", " Paris\t", 1.0),
    ("inner_spaces_kept", r"\boxed{New  York}", "New York", 0.0),
    ("no_box", "Paris", "Paris", 0.0),
    ("last_box_counts_wrong", r"\boxed{Paris} no wait, \boxed{Lyon}", "Paris", 0.0),
    ("last_box_counts_right", r"\boxed{Paris} no wait, \boxed{Lyon}", "Lyon", 1.0),
    ("any_gold_in_list", r"\boxed{NYC}", ["New York", "NYC"], 1.0),
    ("no_gold_in_list", r"\boxed{LA}", ("New York", "NYC"), 0.0),
    ("articles_not_dropped", r"\boxed{The Beatles}", "Beatles", 0.0),
    ("punctuation_not_dropped", r"\boxed{U.S.}", "US", 0.0),
    ("text_wrapper_not_unwrapped", r"\boxed{\text{Paris}}", "Paris", 0.0),
    ("nested_braces_match", r"\boxed{\frac{1}{2}}", r"\frac{1}{2}", 1.0),
    ("unbalanced_last_box", r"\boxed{Paris} \boxed{Par", "Paris", 0.0),
    ("bare_box", r"$\boxed 12$", "12", 1.0),
    ("fbox", r"\fbox{12}", "12", 1.0),
    ("blank_box_equals_blank_gold", r"\boxed{ }", "", 1.0),
    ("blank_box_vs_gold", r"\boxed{}", "Paris", 0.0),
]


@pytest.mark.parametrize(("response", "golds", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_strict_reward_matches_design_rule(
    response: str, golds: str | Sequence[str], expected: float
) -> None:
    assert strict_reward(response, golds) == expected


def test_strict_reward_rejects_empty_gold_list() -> None:
    with pytest.raises(ValueError, match="golds"):
        strict_reward(r"\boxed{a}", [])


@pytest.mark.parametrize(
    ("response", "golds", "name"),
    [(None, "a", "response"), (r"\boxed{a}", None, "golds"), (r"\boxed{a}", ["a", 1], r"golds\[1\]")],
)
def test_strict_reward_rejects_non_strings_naming_argument(
    response: object, golds: object, name: str
) -> None:
    with pytest.raises(TypeError, match=name):
        strict_reward(response, golds)  # type: ignore[arg-type]
