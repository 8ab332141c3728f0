"""A stopped evaluation resumes the questions it left in flight from their last memory update (inflight.jsonl)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from memagent.evaluation.inflight import InflightFile, update_from_json, update_to_json
from memagent.records import MEMORY, Conversation

from .evaluate_cli import evaluate_argv, read_traces

KEY = ("kv_retrieval", 200, 0, "memagent")


def _update(chunk: int, memory: str = "m", decision: str = "") -> Conversation:
    return Conversation(prompt_ids=[], response_ids=[5, 6, chunk], response_mask=[1, 1, 1],
                        logprobs=torch.tensor([-0.5, -0.25, -1.0]), finished=chunk % 2 == 0, kind=MEMORY,
                        chunk_index=chunk, text=memory, decision=decision, decision_tokens=1 if decision else 0)


def _plain(update: Conversation) -> dict:
    return {**dataclasses.asdict(update), "logprobs": update.logprobs.tolist()}


def _lines(*updates: tuple[tuple, Conversation]) -> str:
    return "".join(json.dumps(update_to_json(key, u)) + "\n" for key, u in updates)


def test_an_update_survives_its_line_unchanged() -> None:
    update = _update(3, "key 7 is 42\nsecond line", decision="UPDATE")
    key, back = update_from_json(json.loads(json.dumps(update_to_json(KEY, update))))
    assert key == KEY and _plain(back) == _plain(update)


def test_open_drops_finished_questions_gaps_and_a_cut_off_last_line(tmp_path) -> None:
    other = ("kv_retrieval", 200, 1, "memagent")
    done = ("kv_retrieval", 200, 2, "memagent")
    text = _lines((KEY, _update(0)), (other, _update(0)), (done, _update(0)), (KEY, _update(1)), (other, _update(2)),
                  (KEY, _update(2, "last")))
    path = tmp_path / "inflight.jsonl"
    path.write_text(text + '{"key": ["kv_retrieval", 200, 1, "memagent"], "chunk_i')
    inflight = InflightFile(path, finished={done})
    assert {k: [u.chunk_index for u in v] for k, v in inflight.updates.items()} == {KEY: [0, 1, 2], other: [0]}
    assert inflight.updates[KEY][-1].text == "last"
    # the file now holds exactly the kept lines, so a second open reads the same
    assert path.read_text() == _lines((KEY, _update(0)), (other, _update(0)), (KEY, _update(1)),
                                      (KEY, _update(2, "last")))
    assert InflightFile(path, finished={done}).updates.keys() == inflight.updates.keys()


def test_a_broken_line_before_the_last_is_refused_naming_it(tmp_path) -> None:
    path = tmp_path / "inflight.jsonl"
    path.write_text(_lines((KEY, _update(0))) + "not json\n" + _lines((KEY, _update(1))))
    with pytest.raises(ValueError, match=r"inflight.jsonl:2: not an in-flight memory update"):
        InflightFile(path, finished=set())


def test_a_stopped_evaluation_resumes_its_questions_in_flight_mid_document(evaluate, tiny_model_dir, tmp_path,
                                                                        monkeypatch):
    """Three questions of 5 chunks, all in flight, the backend stopped on its fourth call: each question has 3 memory
    updates on disk and none is finished. The rerun asks only for chunks 3 and 4 and the answers, and writes the
    traces an uninterrupted run writes."""
    argv = evaluate_argv(tiny_model_dir, tmp_path / "stopped", "--chunk-tokens", "40", "--batch-size", "3")
    assert evaluate.main(evaluate_argv(tiny_model_dir, tmp_path / "whole", "--chunk-tokens", "40",
                                       "--batch-size", "3")) == 0
    build = evaluate.build_evaluated_model
    calls: list[int] = []

    def counting(stop_at):
        def build_counted(args):
            evaluated = build(args)
            complete = evaluated.llm.complete

            def counted(requests):
                calls.append(len(requests))
                if len(calls) == stop_at:
                    raise KeyboardInterrupt
                return complete(requests)

            evaluated.llm.complete = counted
            return evaluated
        return build_counted

    monkeypatch.setattr(evaluate, "build_evaluated_model", counting(stop_at=4))
    with pytest.raises(KeyboardInterrupt):
        evaluate.main(argv)
    out = tmp_path / "stopped"
    assert not (out / "traces.jsonl").exists() or read_traces(out) == []
    saved = InflightFile(out / "inflight.jsonl", finished=set()).updates
    assert sorted(len(updates) for updates in saved.values()) == [3, 3, 3]

    calls.clear()
    monkeypatch.setattr(evaluate, "build_evaluated_model", counting(stop_at=-1))
    assert evaluate.main(argv) == 0
    assert calls == [3, 3, 3]  # chunks 3 and 4, then the answers: the first three chunks were not read again
    whole = {t["index"]: t for t in read_traces(tmp_path / "whole")}
    for t in read_traces(out):
        assert t["num_chunks"] == 5 and t["resumed_chunks"] == 3
        same = ("answer", "memories", "memory_cut", "score", "chunks_read", "memory_tokens", "generated_tokens")
        assert {k: t[k] for k in same} == {k: whole[t["index"]][k] for k in same}
    assert not (out / "inflight.jsonl").exists()  # every sample done: nothing left to resume
