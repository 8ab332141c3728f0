"""Gold fates (memagent.evaluation.memory_errors): each gold has exactly one, read from the memories in order."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from memagent.data import make_task
from memagent.evaluation.memory_errors import (
    ANSWERED,
    FATES,
    LOST,
    NEVER_KEPT,
    NOT_ANSWERED,
    count_fates,
    gold_fate,
    main,
    trace_fates,
)

TEXT = st.text(alphabet="ab7 ", max_size=12)


def _trace(task: str, golds: list[str], memories: list[str], extracted: str, index: int = 0) -> dict:
    return {"method": "memagent", "task": task, "golds": golds, "memories": memories, "extracted": extracted,
            "answer": extracted, "index": index, "question": "q?", "score": 0.0, "source": task, "length": 512}


@given(gold=st.text(alphabet="ab7", min_size=1, max_size=3), memories=st.lists(TEXT, max_size=5), extracted=TEXT)
def test_a_gold_is_answered_exactly_when_the_answer_holds_it_else_its_fate_follows_the_memories(
        gold: str, memories: list[str], extracted: str) -> None:
    fate = gold_fate(gold, memories, extracted)
    assert fate in FATES
    held = [gold.lower() in m.lower() for m in memories]
    if gold.lower() in extracted.lower():
        assert fate == ANSWERED
    elif held and held[-1]:
        assert fate == NOT_ANSWERED
    else:
        assert fate == (LOST if any(held) else NEVER_KEPT)


def test_a_gold_written_then_overwritten_is_lost_and_case_is_ignored() -> None:
    assert gold_fate("Alpha7", ["the code is alpha7", "nothing"], "no idea") == LOST
    assert gold_fate("Alpha7", ["nothing", "ALPHA7 kept"], "no idea") == NOT_ANSWERED
    assert gold_fate("Alpha7", ["nothing", "nothing"], "it is alpha7") == ANSWERED
    assert gold_fate("Alpha7", [], "no idea") == NEVER_KEPT


def test_ruler_golds_each_get_a_fate_and_qa_aliases_share_the_best_one() -> None:
    memories = ["11 and 22", "22 only"]
    assert trace_fates(_trace("niah_multivalue", ["11", "22", "33", "44"], memories, "44")) == [
        LOST, NOT_ANSWERED, NEVER_KEPT, ANSWERED]
    assert trace_fates(_trace("hotpotqa_synth", ["Paris", "paris, france", "Lyon"], ["lyon?", "lyon"], "I think"
                              )) == [NOT_ANSWERED]


def test_counts_per_task_skip_baseline_traces_and_sum_to_the_golds() -> None:
    traces = [_trace("niah_multivalue", ["1", "2", "3", "4"], ["1 2"], "1"),
              _trace("niah_single_1", ["9"], ["8"], "9"),
              {**_trace("niah_single_1", ["5"], [], "x"), "method": "full-context"}]
    cells = count_fates("seed0-512", traces)
    assert [(c.task, c.total) for c in cells] == [("niah_multivalue", 4), ("niah_single_1", 1)]
    assert cells[0].counts == {ANSWERED: 1, NOT_ANSWERED: 1, LOST: 0, NEVER_KEPT: 2}


def _write(directory: Path, traces: list[dict]) -> Path:
    directory.mkdir(parents=True)
    (directory / "traces.jsonl").write_text("".join(json.dumps(t) + "\n" for t in traces))
    return directory


def test_the_command_tabulates_each_directory_and_shows_one_question_row_by_row(tmp_path: Path) -> None:
    before = _write(tmp_path / "untrained-512", [_trace("niah_single_1", ["4261940"], ["no number", "none"], "11")])
    after = _write(tmp_path / "seed0-512", [_trace("niah_single_1", ["4261940"], ["4261940", "4261940"], "4261940")])
    table = main([str(before), str(after)]).splitlines()
    assert [line.split("|")[2].strip() for line in table[2:]] == ["untrained-512", "seed0-512"]
    assert [line.split("|")[4].strip() for line in table[2:]] == ["0.0", "100.0"]  # answered (%)
    shown = main([str(before), str(after), "--show", "niah_single_1:0"])
    assert "golds: ['4261940']" in shown and "fates never kept" in shown and "fates answered" in shown
    assert shown.count("memory after chunk 1") == 2


def test_the_command_names_a_directory_without_traces_and_a_bad_show(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="empty: no traces.jsonl"):
        main([str(tmp_path / "empty")])
    run = _write(tmp_path / "run", [])
    with pytest.raises(SystemExit, match="TASK:INDEX"):
        main([str(run), "--show", "niah_single_1"])


def test_bridge_fates_follow_the_regenerated_city_and_a_baseline_row_has_no_memory_fates(
        tmp_path: Path, tiny_model_dir: Path, tiny_tokenizer) -> None:
    questions = make_task("hotpotqa_synth", tiny_tokenizer, 300, 3, seed=5)
    city = [q.extra["bridge"] for q in questions]
    config = {"model": str(tiny_model_dir), "data_seed": 5}

    def hotpot(index: int, memories: list[str] | None, extracted: str, method: str = "memagent") -> dict:
        trace = _trace("hotpotqa_synth", questions[index].answers, memories, extracted, index)
        return {**trace, "length": 300, "method": method}

    seed = _write(tmp_path / "seed0-300", [
        hotpot(0, [f"lives in {city[0]}", "none"], f"{city[0]}"),      # answered (the first hop only)
        hotpot(1, [f"lives in {city[1]}", "none"], "no idea"),         # lost
        hotpot(2, ["none", "none"], "no idea")])                       # never kept
    baseline = _write(tmp_path / "baseline-300", [hotpot(i, None, city[i] if i else "no", "full-context")
                                                  for i in range(3)])
    for d in (seed, baseline):
        (d / "run_config.json").write_text(json.dumps(config))
    table = main([str(seed), str(baseline), "--bridge"]).splitlines()
    rows = {line.split("|")[2].strip(): [c.strip() for c in line.split("|")[3:8]] for line in table[2:]}
    assert rows == {"seed0-300": ["3", "33.3", "0.0", "33.3", "33.3"],
                    "baseline-300": ["3", "66.7", "0.0", "0.0", "33.3"]}
    (seed / "run_config.json").unlink()
    with pytest.raises(SystemExit, match="seed0-300: no run_config.json"):
        main([str(seed), "--bridge"])
