"""string_match_all / string_match_part: RULER's case-insensitive containment, per sample and averaged."""

from collections.abc import Sequence

import pytest

from memagent.verify import string_match_all, string_match_part
from memagent.verify.ruler import string_match_all_batch, string_match_part_batch

# A worked example of RULER's string_match_all / string_match_part definitions.
EXAMPLE_PREDS = ["The values are 1234567 and 7654321.", "nothing"]
EXAMPLE_REFS = [["1234567", "7654321", "1111111"], ["abc"]]

CASES = [
    # (id, prediction, references, expected all, expected part)
    ("two_of_three", EXAMPLE_PREDS[0], EXAMPLE_REFS[0], 2 / 3, 1.0),
    ("none_of_one", EXAMPLE_PREDS[1], EXAMPLE_REFS[1], 0.0, 0.0),
    ("case_insensitive", "The ANSWER is Foo", ["foo", "answer"], 1.0, 1.0),
    ("single_string_reference", "abc", "B", 1.0, 1.0),
    ("substring_not_token", "1234567", ["2345"], 1.0, 1.0),
    ("one_of_four", "VAR ABCDE", ["abcde", "fghij", "klmno", "pqrst"], 0.25, 1.0),
    ("empty_prediction", "", ["x"], 0.0, 0.0),
]


@pytest.mark.parametrize(
    ("prediction", "references", "want_all", "want_part"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_string_match_scores_fraction_and_any_containment(
    prediction: str, references: str | Sequence[str], want_all: float, want_part: float
) -> None:
    assert string_match_all(prediction, references) == pytest.approx(want_all)
    assert string_match_part(prediction, references) == want_part


def test_batch_means_reproduce_worked_example() -> None:
    assert round(100 * string_match_all_batch(EXAMPLE_PREDS, EXAMPLE_REFS), 2) == 33.33
    assert round(100 * string_match_part_batch(EXAMPLE_PREDS, EXAMPLE_REFS), 2) == 50.0


@pytest.mark.parametrize("metric", [string_match_all, string_match_part])
def test_string_match_rejects_empty_references(metric) -> None:
    with pytest.raises(ValueError, match="references"):
        metric("abc", [])


@pytest.mark.parametrize("metric", [string_match_all, string_match_part])
@pytest.mark.parametrize(
    ("prediction", "references", "name"), [(None, ["a"], "prediction"), ("a", [1], "references")]
)
def test_string_match_rejects_non_strings_naming_argument(metric, prediction, references, name: str) -> None:
    with pytest.raises(TypeError, match=name):
        metric(prediction, references)


@pytest.mark.parametrize(
    ("predictions", "references", "error", "name"),
    [
        (["a", "b"], [["a"]], ValueError, "references has 1"),
        ([], [], ValueError, "predictions must not be empty"),
        ("ab", [["a"], ["b"]], TypeError, "predictions"),
        (["a"], "a", TypeError, "references"),
    ],
)
def test_batch_forms_reject_mismatched_or_bare_inputs(predictions, references, error, name: str) -> None:
    for batch in (string_match_all_batch, string_match_part_batch):
        with pytest.raises(error, match=name):
            batch(predictions, references)
