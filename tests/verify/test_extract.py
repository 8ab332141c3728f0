r"""extract_boxed: table of cases derived from the rules in memagent/verify/extract.py's docstring."""

import doctest

import pytest

import memagent.verify.extract
from memagent.verify import extract_boxed

CASES = [
    # (id, text, expected)
    ("plain", r"The answer is \boxed{42}.", "42"),
    ("empty_braces", r"\boxed{}", ""),
    ("nested_braces", r"\boxed{\frac{1}{2}}", r"\frac{1}{2}"),
    ("deeply_nested", r"\boxed{a{b{c}d}e}", "a{b{c}d}e"),
    ("last_of_several", r"\boxed{1} no, \boxed{2}", "2"),
    ("inner_box_starts_last", r"\boxed{\boxed{a}}", "a"),
    ("fbox", r"\fbox{x}", "x"),
    ("fbox_after_boxed_wins", r"\boxed{a} then \fbox{b}", "b"),
    ("boxed_after_fbox_wins", r"\fbox{a} then \boxed{b}", "b"),
    ("content_verbatim_untrimmed", "\\boxed{  Paris \n}", "  Paris \n"),
    ("multiline_content", "\\boxed{a\nb}", "a\nb"),
    ("unicode_content", "答案是 \\boxed{巴黎}。", "巴黎"),
    ("space_before_brace", r"\boxed {a b}", "a b"),
    ("bare_dollar_terminated", r"$\boxed 42$ apples", "42"),
    ("bare_space_terminated", r"\boxed 42 apples", "42"),
    ("bare_end_terminated", r"so \boxed  Paris", "Paris"),
    ("bare_after_tab", "\\boxed\tx y", "x"),
    ("bare_keeps_braces_in_token", r"\boxed a{b}c d", "a{b}c"),
    ("escaped_braces_are_literal", r"\boxed{\{1,2\}}", r"\{1,2\}"),
    ("escaped_backslash_then_close", r"\boxed{a\\}", "a\\\\"),
    ("longer_control_word_is_not_a_box", r"\boxedtext{a}", None),
    ("fboxed_is_not_fbox", r"\boxed{a} \fboxed{b}", "a"),
    ("no_box", "Paris", None),
    ("empty_text", "", None),
    ("unbalanced", r"\boxed{a", None),
    ("unbalanced_last_hides_earlier", r"\boxed{1} and \boxed{2", None),
    ("unbalanced_nested", r"\boxed{{a}", None),
    ("escaped_close_does_not_close", r"\boxed{a\}", None),
    ("bare_command_at_end", r"answer: \boxed", None),
    ("trailing_space_only", "\\boxed ", None),
    ("dollar_right_after", r"$\boxed$", None),
    ("space_then_dollar", r"$\boxed $", None),
    ("digit_needs_whitespace", r"\boxed7", None),
    ("close_brace_right_after", r"\boxed}", None),
]


@pytest.mark.parametrize(("text", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_extract_boxed_follows_documented_rules(text: str, expected: str | None) -> None:
    assert extract_boxed(text) == expected


@pytest.mark.parametrize("bad", [None, b"\\boxed{1}", 3, ["\\boxed{1}"]])
def test_extract_boxed_rejects_non_string_naming_text(bad: object) -> None:
    with pytest.raises(TypeError, match="text"):
        extract_boxed(bad)  # type: ignore[arg-type]


def test_extract_docstring_examples_hold() -> None:
    result = doctest.testmod(memagent.verify.extract)
    assert result.attempted > 0 and result.failed == 0
