"""The full-context baseline's middle truncation, and which metric scores which task."""

from __future__ import annotations

import pytest

from memagent.evaluation.baseline import full_context_prompt
from memagent.evaluation.scoring import STRING_MATCH_ALL, SUB_EM, score_answer
from memagent.evaluation.tables import aggregate
from memagent.records import Sample

WORDS = [f"w{i:04d}" for i in range(600)]


def _long_sample() -> Sample:
    return Sample(context=" ".join(WORDS), question="Which word comes first?", answers=["w0000"], task="kv_retrieval")


def test_baseline_keeps_head_and_tail_and_drops_the_middle(tiny_tokenizer):
    prompt = full_context_prompt(_long_sample(), tiny_tokenizer, window=700, answer_tokens=32, question_tokens=64)
    text = prompt.request.messages[0]["content"]
    assert prompt.kept_tokens < prompt.document_tokens
    assert "w0000" in text and "w0599" in text  # both ends survive
    assert "w0300" not in text  # the middle is gone
    assert prompt.prompt_tokens + 32 <= 700


def test_baseline_keeps_a_document_that_fits_whole(tiny_tokenizer):
    sample = Sample(context=" ".join(WORDS[:20]), question="q?", answers=["w0000"])
    prompt = full_context_prompt(sample, tiny_tokenizer, window=4096, answer_tokens=32, question_tokens=64)
    assert prompt.kept_tokens == prompt.document_tokens
    assert " ".join(WORDS[:20]) in prompt.request.messages[0]["content"]


def test_baseline_refuses_a_window_with_no_room_for_the_document(tiny_tokenizer):
    with pytest.raises(ValueError, match="--window"):
        full_context_prompt(_long_sample(), tiny_tokenizer, window=64, answer_tokens=32, question_tokens=64)


def test_ruler_tasks_use_string_match_all_with_partial_credit():
    score = score_answer("niah_multivalue", r"\boxed{1234567, 7654321}", ["1234567", "7654321", "1111111", "9999999"])
    assert score.metric == STRING_MATCH_ALL and score.score == pytest.approx(0.5) and score.em is None


def test_qa_tasks_use_lenient_sub_em_and_report_em_and_f1():
    score = score_answer("hotpotqa", r"So \boxed{The Eiffel Tower}.", ["Eiffel Tower"])
    assert (score.metric, score.score, score.em, score.f1) == (SUB_EM, 1.0, 1.0, 1.0)


@pytest.mark.parametrize("response", ["The answer is: The answer is:", "The answer is: .", r"\boxed{The.}"])
def test_a_qa_answer_with_no_content_after_normalizing_scores_zero(response):
    # MemAgent's sub_em finds the empty string inside every gold and pays 1.0 (a looping gated policy whose answer
    # extracts to ":" scored 7 of 48 on hotpotqa_synth that way); the evaluation score must not.
    score = score_answer("hotpotqa_synth", response, ["Stairmelia"])
    assert (score.score, score.em, score.f1) == (0.0, 0.0, 0.0)


def test_failed_request_scores_zero_and_counts_in_the_denominator():
    ok = {"method": "memagent", "source": "qa", "length": 1, "num_chunks": 1, "wall_s": 0.0, "error": None}
    rows = aggregate([
        {**ok, **vars(score_answer("qa", r"\boxed{Paris}", ["Paris"]))},
        {**ok, **vars(score_answer("qa", "", ["Paris"], failed=True)), "error": "llm request failed"},
    ])
    assert (rows[0].n, rows[0].failed, rows[0].score) == (2, 1, 50.0)


def test_plot_without_matplotlib_says_how_to_install_it(monkeypatch, tmp_path):
    import sys

    from memagent.evaluation.plot import plot_results

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` raise ImportError
    with pytest.raises(RuntimeError, match="pip install matplotlib"):
        plot_results([], tmp_path / "p.png")
