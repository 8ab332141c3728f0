"""Readers and writers: what we write reads back as the same samples; bad input fails naming file, line, field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memagent.data import Sample, make_task, read_samples, write_samples

FORMAT_PATHS = [("eval", "eval_8.json"), ("ruler", "niah.jsonl"), ("train", "train.jsonl")]


@pytest.fixture(scope="module")
def generated(tokenizer) -> list[Sample]:
    """Samples with every kind of extra our generators set: answer_prefix, num_docs, none."""
    return (
        make_task("niah_multivalue", tokenizer, 300, 2, seed=0)
        + make_task("hotpotqa_synth", tokenizer, 300, 2, seed=0)
        + make_task("kv_retrieval", tokenizer, 300, 2, seed=0)
    )


@pytest.mark.parametrize("fmt, name", FORMAT_PATHS)
def test_reading_a_written_file_gives_the_same_samples(tmp_path, generated, fmt, name):
    path = write_samples(tmp_path / name, generated, format=fmt)
    assert read_samples(path) == generated


def test_parquet_training_file_reads_back_the_same_samples(tmp_path, generated):
    pytest.importorskip("pyarrow")
    path = write_samples(tmp_path / "train.parquet", generated)
    assert read_samples(path) == generated


def test_parquet_without_pyarrow_says_how_to_proceed(tmp_path, generated):
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        with pytest.raises(RuntimeError, match="parquet needs pyarrow.*use a .jsonl path"):
            write_samples(tmp_path / "train.parquet", generated)
    else:
        pytest.skip("pyarrow is installed")


text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)
samples_strategy = st.lists(
    st.builds(
        Sample,
        context=text.filter(lambda t: t.strip() != ""),
        question=text,
        answers=st.lists(text, min_size=1, max_size=3),
        task=st.sampled_from(["", "hotpotqa", "niah_single_1"]),
        index=st.integers(0, 10**6),
        length=st.integers(0, 10**6),
        extra=st.dictionaries(st.sampled_from(["num_docs", "note", "score"]), st.integers(0, 99), max_size=2),
    ),
    max_size=4,
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(samples=samples_strategy)
@pytest.mark.parametrize("fmt, name", FORMAT_PATHS)
def test_any_samples_round_trip_through_each_format(tmp_path, fmt, name, samples):
    path = write_samples(tmp_path / name, samples, format=fmt)
    assert read_samples(path, format=fmt) == samples


def test_memagent_fields_are_written_as_memagent_reads_them(tmp_path, generated):
    hotpot = generated[2]
    (row,) = json.loads(write_samples(tmp_path / "e.json", [hotpot]).read_text())
    assert {k: row[k] for k in ("context", "input", "answers", "num_docs", "index")} == {
        "context": hotpot.context, "input": hotpot.question, "answers": hotpot.answers,
        "num_docs": hotpot.extra["num_docs"], "index": hotpot.index,
    }  # fmt: skip
    train = json.loads(write_samples(tmp_path / "t.jsonl", [hotpot], format="train").read_text())
    assert train["prompt"] == [{"role": "user", "content": hotpot.question}]
    assert train["reward_model"] == {"style": "rule", "ground_truth": hotpot.answers}
    assert train["ability"] == "memory" and train["data_source"] == "hotpotqa_synth"
    assert train["extra_info"]["num_docs"] == hotpot.extra["num_docs"]


GOOD_RULER = {"index": 0, "input": "q?", "context": "some text", "outputs": ["a"], "length": 3}


def _write_rows(path: Path, rows: list[object]) -> Path:
    path.write_text(
        "\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n", encoding="utf-8"
    )
    return path


@pytest.mark.parametrize(
    "bad, message",
    [
        ({**GOOD_RULER, "outputs": "a"}, "line 2: field 'outputs' must be a list of strings"),
        ({**GOOD_RULER, "outputs": []}, "line 2: field 'outputs' must hold at least one gold answer"),
        ({k: v for k, v in GOOD_RULER.items() if k != "input"}, "line 2: field 'input' is missing"),
        ({**GOOD_RULER, "length": "3"}, "line 2: field 'length' must be an integer"),
        ({**GOOD_RULER, "context": "  "}, "line 2: field 'context' is empty"),
        ({**GOOD_RULER, "context": [4, 5]}, "line 2: field 'context' is a list of document indices"),
        ({k: v for k, v in GOOD_RULER.items() if k != "context"}, "line 2: field 'context' is missing"),
        ("{not json", "line 2: invalid JSON"),
        ("[1, 2]", "line 2: a row must be a JSON object"),
    ],
)
def test_malformed_ruler_rows_name_file_line_and_field(tmp_path, bad, message):
    path = _write_rows(tmp_path / "x.jsonl", [GOOD_RULER, bad])
    with pytest.raises(ValueError, match=f"x.jsonl {message}"):
        read_samples(path)


def test_malformed_training_rows_name_the_nested_field(tmp_path, generated):
    path = write_samples(tmp_path / "t.jsonl", generated[:1], format="train")
    row = json.loads(path.read_text())
    _write_rows(path, [{**row, "reward_model": {"style": "rule", "ground_truth": [1]}}])
    with pytest.raises(ValueError, match="t.jsonl line 1: field 'reward_model.ground_truth' must be a list"):
        read_samples(path)
    _write_rows(path, [{**row, "prompt": [{"role": "system", "content": "x"}]}])
    with pytest.raises(ValueError, match="line 1: field 'prompt' must be a list of messages"):
        read_samples(path)


def test_malformed_eval_items_name_the_json_index(tmp_path):
    path = tmp_path / "eval_50.json"
    path.write_text(
        json.dumps([{"context": "c", "input": "q", "answers": ["a"]}, {"context": "c", "input": "q"}])
    )
    with pytest.raises(ValueError, match="eval_50.json item 1: field 'answers' is missing"):
        read_samples(path)
    path.write_text('[{"context": "c",\n "input": }]')
    with pytest.raises(ValueError, match="eval_50.json line 2 column 11: invalid JSON"):
        read_samples(path)


def test_non_utf8_input_names_the_file(tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(json.dumps(GOOD_RULER).replace("some text", "caf\xe9").encode("latin-1"))
    with pytest.raises(ValueError, match="latin1.jsonl: not UTF-8 text"):
        read_samples(path)


def test_empty_context_is_accepted_only_when_asked(tmp_path):
    path = _write_rows(tmp_path / "x.jsonl", [{**GOOD_RULER, "context": ""}])
    with pytest.raises(ValueError, match="field 'context' is empty"):
        read_samples(path)
    assert read_samples(path, allow_empty_context=True)[0].context == ""


def test_skip_invalid_skips_bad_rows_and_warns_with_the_count(tmp_path):
    path = _write_rows(tmp_path / "x.jsonl", [GOOD_RULER, "{bad", {**GOOD_RULER, "outputs": 3}, GOOD_RULER])
    with pytest.warns(UserWarning, match="skipped 2 invalid rows; the first: .*line 2: invalid JSON"):
        samples = read_samples(path, skip_invalid=True)
    assert len(samples) == 2


def test_unknown_row_layout_and_ambiguous_paths_are_refused(tmp_path, generated):
    path = _write_rows(tmp_path / "x.jsonl", [{"text": "hello"}])
    with pytest.raises(ValueError, match="cannot tell the format from the keys \\['text'\\]"):
        read_samples(path)
    with pytest.raises(ValueError, match="pass format='ruler' or format='train'"):
        write_samples(tmp_path / "y.jsonl", generated)
    with pytest.raises(ValueError, match="format 'eval' is written as .json"):
        write_samples(tmp_path / "y.jsonl", generated, format="eval")
