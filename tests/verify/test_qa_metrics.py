"""normalize_answer, exact_match, f1_score, sub_exact_match: HotpotQA / SQuAD rules, values worked by hand."""

import doctest
from collections.abc import Sequence

import pytest

import memagent.verify.qa_metrics
from memagent.verify import exact_match, f1_score, normalize_answer, sub_exact_match

NORMALIZE_CASES = [
    # (id, text, expected)
    ("lowercases_and_drops_article", "The Beatles", "beatles"),
    ("collapses_whitespace_and_punctuation", "  Hello,   World!  ", "hello world"),
    ("all_three_articles", "an apple a day the end", "apple day end"),
    ("article_inside_word_kept", "theory another", "theory another"),
    ("uppercase_article", "THE END", "end"),
    ("dots_deleted", "U.S.A.", "usa"),
    ("hyphen_joins_words", "A-Team", "ateam"),
    ("joined_articles_are_one_word", "the-the", "thethe"),
    ("underscore_is_punctuation", "a_b", "ab"),
    ("apostrophe_deleted", "l'enfant", "lenfant"),
    ("unicode_guillemets_kept", "«Paris»", "«paris»"),
    ("unicode_dash_kept", "Paris—France", "paris—france"),
    ("cjk_full_stop_kept", "你好。", "你好。"),
    ("tabs_and_newlines", "a\tb\nc", "b c"),
    ("only_article_and_dot", "The.", ""),
    ("empty", "", ""),
]


@pytest.mark.parametrize(
    ("text", "expected"), [c[1:] for c in NORMALIZE_CASES], ids=[c[0] for c in NORMALIZE_CASES]
)
def test_normalize_answer_follows_hotpotqa_steps(text: str, expected: str) -> None:
    assert normalize_answer(text) == expected


EXACT_CASES = [
    ("equal_after_normalizing", "The Beatles!", "beatles", 1.0),
    ("different", "Beatles", "The Rolling Stones", 0.0),
    ("both_empty", "", "", 1.0),
    ("normalizes_to_empty", "The.", "", 1.0),
    ("substring_is_not_exact", "Paris", "Paris France", 0.0),
    ("max_over_golds", "NYC", ["New York", "nyc"], 1.0),
]


@pytest.mark.parametrize(
    ("prediction", "gold", "expected"), [c[1:] for c in EXACT_CASES], ids=[c[0] for c in EXACT_CASES]
)
def test_exact_match_compares_normalized_strings(
    prediction: str, gold: str | Sequence[str], expected: float
) -> None:
    assert exact_match(prediction, gold) == expected


F1_CASES = [
    # Tokens after normalizing; F1 = 2PR / (P + R) with P = same/|pred|, R = same/|gold|.
    ("identical", "Paris", "Paris", 1.0),
    ("article_dropped_then_p_one_third", "the city of Paris", "Paris", 0.5),  # P 1/3, R 1
    ("p_two_thirds", "New York City", "New York", 0.8),  # P 2/3, R 1
    ("multiset_counts", "a b b", "b b c", 0.8),  # [b b] vs [b b c]: P 1, R 2/3
    ("repeated_pred_token", "b b", "b", 2 / 3),  # same 1: P 1/2, R 1
    ("no_common_token", "London", "Paris", 0.0),
    ("yes_vs_no", "yes", "no", 0.0),
    ("yes_vs_yes", "Yes.", "yes", 1.0),
    ("special_pred_vs_longer_gold", "no", "no answer", 0.0),  # plain F1 would be 2/3
    ("special_gold_vs_longer_pred", "yes it is", "yes", 0.0),  # plain F1 would be 1/2
    ("noanswer_vs_no_answer", "noanswer", "no answer", 0.0),
    ("both_empty_is_zero", "", "", 0.0),
    ("both_normalize_to_empty", "The", "a", 0.0),
    ("max_over_golds", "Paris", ["London", "Paris France"], 2 / 3),  # P 1, R 1/2
]


@pytest.mark.parametrize(
    ("prediction", "gold", "expected"), [c[1:] for c in F1_CASES], ids=[c[0] for c in F1_CASES]
)
def test_f1_score_follows_hotpotqa_rules(prediction: str, gold: str | Sequence[str], expected: float) -> None:
    assert f1_score(prediction, gold) == pytest.approx(expected)


SUB_EM_CASES = [
    ("prediction_inside_gold", "Par", "Paris", 1.0),
    ("gold_inside_prediction", "It is Paris, France", "paris", 1.0),
    ("substring_not_token", "cat", "concatenate", 1.0),
    ("disjoint", "London", "Paris", 0.0),
    ("none_prediction", None, "Paris", 0.0),
    ("empty_prediction", "", "Paris", 0.0),
    ("blank_prediction", " \n ", "Paris", 0.0),
    ("normalizes_to_empty_is_lenient", "The.", "Paris", 1.0),
    ("max_over_golds", "Lyon", ["Paris", "Lyon"], 1.0),
]


@pytest.mark.parametrize(
    ("prediction", "gold", "expected"), [c[1:] for c in SUB_EM_CASES], ids=[c[0] for c in SUB_EM_CASES]
)
def test_sub_exact_match_is_normalized_containment_either_way(
    prediction: str | None, gold: str | Sequence[str], expected: float
) -> None:
    assert sub_exact_match(prediction, gold) == expected


@pytest.mark.parametrize("metric", [exact_match, f1_score, sub_exact_match])
def test_metrics_reject_empty_gold_list(metric) -> None:
    with pytest.raises(ValueError, match="gold"):
        metric("Paris", [])


@pytest.mark.parametrize("metric", [exact_match, f1_score, sub_exact_match])
@pytest.mark.parametrize(
    ("prediction", "gold", "name"), [(3, "a", "prediction"), ("a", [None], r"gold\[0\]")]
)
def test_metrics_reject_non_strings_naming_argument(
    metric, prediction: object, gold: object, name: str
) -> None:
    with pytest.raises(TypeError, match=name):
        metric(prediction, gold)


def test_normalize_answer_rejects_non_string_naming_s() -> None:
    with pytest.raises(TypeError, match="s must be a str"):
        normalize_answer(None)  # type: ignore[arg-type]


def test_qa_metrics_docstring_examples_hold() -> None:
    result = doctest.testmod(memagent.verify.qa_metrics)
    assert result.attempted > 0 and result.failed == 0
