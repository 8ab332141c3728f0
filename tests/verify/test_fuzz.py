r"""Property and robustness tests: arbitrary text never raises, brace soup agrees with a slow reference scan,
and 1 MB adversarial inputs finish (linear-time scans, no regex backtracking blow-up)."""

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memagent.verify import (
    exact_match,
    extract_boxed,
    f1_score,
    lenient_reward,
    normalize_answer,
    strict_reward,
    string_match_all,
    string_match_part,
    sub_exact_match,
)

MB = 1 << 20
# Hypothesis' default 200 ms deadline is too tight for a shared 2-core box; bounds are asserted where they matter.
FAST = settings(max_examples=150, deadline=None)


def reference_extract_boxed(text: str) -> str | None:
    """Slow, obviously-correct character scan of the rules in memagent/verify/extract.py's docstring."""
    command_end = None
    for i in range(len(text)):
        for name in ("\\boxed", "\\fbox"):
            end = i + len(name)
            if text.startswith(name, i) and not (
                end < len(text) and text[end].isascii() and text[end].isalpha()
            ):
                command_end = end
    if command_end is None:
        return None
    k = command_end
    while k < len(text) and text[k].isspace():
        k += 1
    if k < len(text) and text[k] == "{":
        depth, i = 0, k
        while i < len(text):
            if text[i] == "\\":
                i += 2
                continue
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
                if depth == 0:
                    return text[k + 1 : i]
            i += 1
        return None
    if k == command_end:
        return None
    end = k
    while end < len(text) and not text[end].isspace() and text[end] != "$":
        end += 1
    return text[k:end] or None


SOUP_PIECES = ["\\boxed", "\\fbox", "\\", "{", "}", " ", "\n", "$", "a", "x", "é", "7"]
soup = st.lists(st.sampled_from(SOUP_PIECES), max_size=40).map("".join)
golds = st.one_of(st.text(max_size=20), st.lists(st.text(max_size=20), min_size=1, max_size=3))


@FAST
@given(soup)
def test_extract_boxed_agrees_with_reference_scan_on_brace_soup(text: str) -> None:
    assert extract_boxed(text) == reference_extract_boxed(text)


@FAST
@given(st.text(), st.text())
def test_extract_boxed_agrees_with_reference_scan_on_any_text(prefix: str, suffix: str) -> None:
    text = prefix + "\\boxed" + suffix
    assert extract_boxed(text) == reference_extract_boxed(text)


balanced = st.recursive(
    st.text(alphabet="abc $\n", max_size=5),
    lambda inner: st.lists(inner, max_size=3).map(lambda parts: "{" + "".join(parts) + "}"),
    max_leaves=20,
)


@FAST
@given(st.text(alphabet="abc {}$", max_size=10), st.lists(balanced, max_size=4).map("".join))
def test_extract_boxed_returns_balanced_content_of_last_box(prefix: str, content: str) -> None:
    assert extract_boxed(prefix + "\\boxed{" + content + "} done") == content


@FAST
@given(st.text(), golds)
def test_verifiers_never_raise_and_return_binary_scores(response: str, gold: str | list[str]) -> None:
    boxed = extract_boxed(response)
    assert boxed is None or boxed in response
    for score in (
        strict_reward(response, gold),
        lenient_reward(response, gold),
        sub_exact_match(response, gold),
    ):
        assert score in (0.0, 1.0)
    assert exact_match(response, gold) in (0.0, 1.0)
    assert 0.0 <= f1_score(response, gold) <= 1.0


@FAST
@given(st.text(), st.lists(st.text(max_size=10), min_size=1, max_size=4))
def test_string_match_scores_are_fractions_and_part_bounds_all(
    prediction: str, references: list[str]
) -> None:
    match_all, match_part = (
        string_match_all(prediction, references),
        string_match_part(prediction, references),
    )
    assert 0.0 <= match_all <= match_part <= 1.0
    assert match_all * len(references) == pytest.approx(round(match_all * len(references)))


@FAST
@given(st.text())
def test_normalize_answer_is_idempotent(text: str) -> None:
    once = normalize_answer(text)
    assert normalize_answer(once) == once


@FAST
@given(st.text(max_size=30), st.text(max_size=30))
def test_f1_is_symmetric_and_one_on_nonempty_exact_match(a: str, b: str) -> None:
    assert f1_score(a, b) == pytest.approx(f1_score(b, a))
    if exact_match(a, b) == 1.0 and normalize_answer(a):
        assert f1_score(a, b) == 1.0


# A gold without braces or backslashes survives boxing unchanged, after whatever text precedes it.
plain_gold = st.text(st.characters(exclude_characters="{}\\"), min_size=1, max_size=20).filter(str.strip)


@FAST
@given(plain_gold, st.text(max_size=20))
def test_strict_and_lenient_accept_the_boxed_gold_itself(gold: str, prefix: str) -> None:
    assert strict_reward(prefix + "\\boxed{" + gold + "}", gold) == 1.0
    assert lenient_reward(prefix + "\\boxed{" + gold + "}", gold) == 1.0


ADVERSARIAL_1MB = {
    "open_brace_run": "\\boxed" + "{" * MB,
    "repeated_open_boxes": "\\boxed{" * (MB // 7),
    "command_run": "\\boxed" * (MB // 6),
    "backslash_run": "\\boxed{" + "\\" * MB,
    "balanced_pairs": "\\boxed{" + "{}" * (MB // 2) + "}",
    "long_bare_token": "\\boxed " + "x" * MB,
    "whitespace_after_command": "\\boxed" + " " * MB,
    "marker_run": "the answer is " * (MB // 14),
    "star_space_tail": "the answer is" + " *" * (MB // 2) + "x",
    "article_soup": "a an the " * (MB // 9),
    "whitespace_between_words": "a" + " " * MB + "b",
}
EXPECTED_BOX = {"balanced_pairs": "{}" * (MB // 2), "long_bare_token": "x" * MB}


@pytest.mark.parametrize("name", list(ADVERSARIAL_1MB))
def test_one_megabyte_adversarial_input_finishes(name: str) -> None:
    text = ADVERSARIAL_1MB[name]
    start = time.perf_counter()
    boxed = extract_boxed(text)
    scores = (strict_reward(text, "x"), lenient_reward(text, "x"), string_match_all(text, ["x"]))
    normalize_answer(text)
    elapsed = time.perf_counter() - start
    assert boxed == EXPECTED_BOX.get(name)
    assert all(s in (0.0, 1.0) for s in scores)
    assert elapsed < 5.0, f"{name}: {elapsed:.2f} s suggests super-linear scanning"


@settings(max_examples=5, deadline=None)
@given(st.lists(st.sampled_from(SOUP_PIECES + ["the answer is", "*"]), min_size=1, max_size=12).map("".join))
def test_one_megabyte_repeated_soup_finishes(pattern: str) -> None:
    text = pattern * (MB // len(pattern) + 1)
    start = time.perf_counter()
    boxed = extract_boxed(text)
    lenient_reward(text, ["x", "a"])
    assert boxed is None or boxed in text
    assert time.perf_counter() - start < 5.0
