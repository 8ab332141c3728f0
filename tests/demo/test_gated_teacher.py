"""The demo's teacher in a gated workflow (memagent.demo.task.OracleLLM with decisions; docs/gates.md, docs/demo.md).

The teacher gates by the rule (ANSWER once the memory holds the needle, UPDATE on the needle's chunk, KEEP otherwise)
on a share `informed` of its decisions and blindly on the rest (a word drawn among those on offer, whatever the chunk
holds); after UPDATE its memory is the oracle's, forgetful or not. A blind teacher teaches the grammar alone and
leaves when to keep, update or stop to RL; the `tiny-gates` preset's is right on 80% of its decisions.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path

import pytest

from memagent.demo.task import UNSEEN, OracleLLM, corpus, generate_code_lookup
from memagent.demo.warm_start import compact_oracle_rows, oracle_rows
from memagent.model import build_tiny_model, load_tokenizer
from memagent.records import MEMORY
from memagent.rollout.gates import ANSWER_NOW, KEEP, UNPARSED, UPDATE
from memagent.rollout.prompts import WorkflowConfig
from memagent.rollout.workflow import run_memagent

GATED = WorkflowConfig(chunk_tokens=32, memory_tokens=10, answer_tokens=8, max_chunks=8, question_tokens=64,
                       gates="both")


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory):
    path: Path = build_tiny_model(tmp_path_factory.mktemp("demo") / "model", hidden_size=32, num_layers=2,
                                  intermediate_size=64, corpus=corpus())
    return load_tokenizer(path)


def questions(tok, n: int, chunks: int = 4, seed: int = 0):
    return generate_code_lookup(tok, num_chunks=chunks, chunk_tokens=32, num_samples=n, seed=seed)


def test_the_demo_tokenizer_spells_each_gate_word_as_one_token(tok) -> None:
    for word in (KEEP, UPDATE, ANSWER_NOW):
        assert len(tok(word, add_special_tokens=False)["input_ids"]) == 1, word


def test_every_teacher_decision_parses_and_only_offered_words_are_drawn(tok) -> None:
    qs = questions(tok, 40)
    for gates, never in (("both", None), ("update", ANSWER_NOW), ("exit", KEEP)):
        workflow = dataclasses.replace(GATED, gates=gates)
        trajs = run_memagent(qs, OracleLLM(tok, decisions=(0.3, 0.4, 0.3), seed=1), workflow)
        drawn = Counter(d for t in trajs for d in t.decisions)
        assert UNPARSED not in drawn and never not in drawn and drawn[UPDATE] > 0
        assert len(drawn) == (3 if gates == "both" else 2), drawn


def test_keep_leaves_the_memory_byte_identical_and_update_writes_the_oracle_memory(tok) -> None:
    qs = questions(tok, 30)
    trajs = run_memagent(qs, OracleLLM(tok, decisions=(0.5, 0.5, 0.0), seed=2), GATED)
    seen = Counter()
    for t in trajs:
        s = qs[t.sample_index]
        before = GATED.initial_memory
        for k, (decision, memory) in enumerate(zip(t.decisions, t.memories)):
            seen[decision] += 1
            if decision == KEEP:
                assert memory == before
            else:  # the exact oracle: the needle once it is in the section or carried in the memory
                found = k >= s.extra["needle_chunk"] and (k == s.extra["needle_chunk"] or s.extra["needle"] in before)
                assert memory == (s.extra["needle"] if found else UNSEEN.format(key=s.extra["key"]))
            before = memory
    assert seen[KEEP] > 10 and seen[UPDATE] > 10


def test_answer_stops_reading_and_keep_and_answer_responses_end_without_an_end_token(tok) -> None:
    qs = questions(tok, 30)
    trajs = run_memagent(qs, OracleLLM(tok, decisions=(0.3, 0.4, 0.3), seed=3), GATED)
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    stopped = [t for t in trajs if ANSWER_NOW in t.decisions]
    assert stopped
    for t in stopped:  # reading stopped at the ANSWER: it is the last update, and the chunks after it were not read
        assert t.decisions.count(ANSWER_NOW) == 1 and t.decisions[-1] == ANSWER_NOW
        assert t.num_chunks == len(t.decisions) <= t.document_chunks == 4
    assert any(t.num_chunks < 4 for t in stopped)
    for t in trajs:
        for c in (c for c in t.conversations if c.kind == MEMORY):
            word_only = c.decision in (KEEP, ANSWER_NOW)
            assert (c.response_ids[-1] != eos) == word_only
            if word_only:
                assert tok.decode(c.response_ids) == c.decision and c.decision_tokens == len(c.response_ids) == 1


def test_decision_shares_follow_the_teacher_chances(tok) -> None:
    qs = questions(tok, 300)
    trajs = run_memagent(qs, OracleLLM(tok, decisions=(0.3, 0.6, 0.1), seed=4), GATED)
    drawn = Counter(d for t in trajs for d in t.decisions)
    n = sum(drawn.values())  # several hundred draws; each share within 4.5 binomial sd
    for word, p in ((KEEP, 0.3), (UPDATE, 0.6), (ANSWER_NOW, 0.1)):
        assert abs(drawn[word] - p * n) < 4.5 * (p * (1 - p) * n) ** 0.5, (word, drawn)


def test_an_ungated_workflow_gets_the_same_teacher_memories_whatever_its_decision_chances(tok) -> None:
    qs = questions(tok, 20)
    ungated = dataclasses.replace(GATED, gates="none")
    plain = run_memagent(qs, OracleLLM(tok, keep_probability=0.3, seed=5), ungated)
    with_chances = run_memagent(qs, OracleLLM(tok, keep_probability=0.3, seed=5, decisions=(0.3, 0.6, 0.1)),
                                ungated)
    assert [t.memories for t in plain] == [t.memories for t in with_chances]
    assert all(d == "" for t in plain for d in t.decisions)


def test_gated_sft_rows_train_the_decision_and_compact_rows_stay_ungated(tok) -> None:
    qs = questions(tok, 6, chunks=3)
    rows = oracle_rows(qs, tok, GATED, decisions=(0.0, 1.0, 0.0))
    update_line = tok(f"{UPDATE}\n", add_special_tokens=False)["input_ids"]
    for question_rows in rows:
        for row in question_rows[:-1]:  # memory updates, then the answer
            assert row.input_ids[row.prompt_len:row.prompt_len + len(update_line)] == update_line
    compact = compact_oracle_rows(qs, tok, dataclasses.replace(GATED, gates="none"))
    for question_rows in compact:
        assert all(tok.decode(r.input_ids[r.prompt_len:]).find(UPDATE) < 0 for r in question_rows)


def test_an_informed_teacher_keeps_until_the_needle_updates_on_it_and_answers_right_after(tok) -> None:
    qs = questions(tok, 40, chunks=5)
    for t in run_memagent(qs, OracleLLM(tok, informed=1.0, decisions=(0.3, 0.4, 0.3)), GATED):
        s = qs[t.sample_index]
        at = s.extra["needle_chunk"]
        assert t.decisions == [KEEP] * at + [UPDATE] + ([ANSWER_NOW] if at < 4 else [])
        assert t.memories[-1] == s.extra["needle"] and t.answer == f"\\boxed{{{s.answers[0]}}}"
    update_only = dataclasses.replace(GATED, gates="update")  # no exit on offer: KEEP after the needle
    for t in run_memagent(qs, OracleLLM(tok, informed=1.0), update_only):
        at = qs[t.sample_index].extra["needle_chunk"]
        assert t.decisions == [KEEP] * at + [UPDATE] + [KEEP] * (4 - at)


def test_a_partly_informed_teacher_follows_the_rule_at_least_that_often(tok) -> None:
    qs = questions(tok, 200)
    trajs = run_memagent(qs, OracleLLM(tok, informed=0.5, decisions=(0.0, 1.0, 0.0), seed=6), GATED)
    before = [d for t in trajs for d in t.decisions[:qs[t.sample_index].extra["needle_chunk"]]]
    # before the needle the rule says KEEP; the blind draw (UPDATE only here) never does
    assert abs(before.count(KEEP) - 0.5 * len(before)) < 4.5 * (0.25 * len(before)) ** 0.5
    assert set(before) == {KEEP, UPDATE}


def test_bad_decision_chances_are_refused(tok) -> None:
    for bad in ((0.5, 0.0, 0.5), (-0.1, 1.0, 0.0), (0.5, 0.5)):
        with pytest.raises(ValueError, match="decisions"):
            OracleLLM(tok, decisions=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="informed"):
        OracleLLM(tok, informed=1.5)
