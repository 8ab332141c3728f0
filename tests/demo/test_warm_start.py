"""The demo task, its oracle and the two warm-start stages (memagent.demo.task, warm_start)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from memagent.config import DemoConfig
from memagent.demo.task import KEYS, UNSEEN, VALUES, OracleLLM, corpus, generate_code_lookup
from memagent.demo.warm_start import (
    compact_oracle_rows,
    compact_pretrain,
    oracle_rows,
    supervised_updates,
    warm_start,
)
from memagent.model import build_tiny_model, load_model, load_tokenizer
from memagent.rollout.prompts import WorkflowConfig
from memagent.rollout.workflow import run_memagent
from memagent.verify.strict import strict_reward

MEMORY_CFG = WorkflowConfig(chunk_tokens=32, memory_tokens=10, answer_tokens=8, max_chunks=8, question_tokens=64)


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small model with the demo's own tokenizer (keys and values are single tokens)."""
    return build_tiny_model(tmp_path_factory.mktemp("demo") / "model", hidden_size=32, num_layers=2,
                            intermediate_size=64, corpus=corpus())


@pytest.fixture(scope="module")
def tok(demo_dir: Path):
    return load_tokenizer(demo_dir)


def samples(tok, n: int = 6, chunks: int = 3, seed: int = 0, distractors: int = 0):
    return generate_code_lookup(tok, num_chunks=chunks, chunk_tokens=32, num_samples=n, seed=seed,
                                distractors=distractors)


@pytest.mark.parametrize("distractors", [0, 2])
def test_every_chunk_has_exactly_chunk_tokens_and_the_needle_is_in_its_chunk(tok, distractors: int) -> None:
    for s in samples(tok, n=8, chunks=4, distractors=distractors):
        ids = tok(s.context, add_special_tokens=False)["input_ids"]
        assert len(ids) == 4 * 32 == s.length
        chunks = [tok.decode(ids[k * 32:(k + 1) * 32]) for k in range(4)]
        holding = [k for k, c in enumerate(chunks) if s.extra["needle"] in c]
        assert holding == [s.extra["needle_chunk"]]
        code_lines = sum(c.count("code ") for c in chunks)
        assert code_lines == 1 + 4 * distractors
        assert s.answers[0] in VALUES and s.extra["key"] in KEYS


def test_demo_tokenizer_spells_every_key_and_value_as_one_token(tok) -> None:
    for word in (*KEYS, *VALUES):
        assert len(tok(" " + word, add_special_tokens=False)["input_ids"]) == 1, word


def test_oracle_memory_is_unseen_before_the_needle_and_the_needle_after(tok) -> None:
    qs = samples(tok, n=8, chunks=3, distractors=1)
    for traj in run_memagent(qs, OracleLLM(tok), MEMORY_CFG):
        s = qs[traj.sample_index]
        expected = [s.extra["needle"] if k >= s.extra["needle_chunk"] else UNSEEN.format(key=s.extra["key"])
                    for k in range(3)]
        assert traj.memories == expected
        assert strict_reward(traj.answer, s.answers) == 1.0


def test_forgetful_teacher_keeps_a_found_needle_with_its_keep_probability(tok) -> None:
    """Only memory updates after the needle's chunk are affected; each keeps the needle w.p. keep_probability."""
    qs = samples(tok, n=150, chunks=2)
    never = run_memagent(qs, OracleLLM(tok, keep_probability=0.0), MEMORY_CFG)
    for t in never:
        s = qs[t.sample_index]
        needle, unseen = s.extra["needle"], UNSEEN.format(key=s.extra["key"])
        assert t.memories == ([needle, unseen] if s.extra["needle_chunk"] == 0 else [unseen, needle])
    some = run_memagent(qs, OracleLLM(tok, keep_probability=0.4, seed=3), MEMORY_CFG)
    chances = [t for t in some if qs[t.sample_index].extra["needle_chunk"] == 0]
    kept = sum(t.memories[1] == qs[t.sample_index].extra["needle"] for t in chances)
    n = len(chances)  # about 75; binomial(n, 0.4) lies within 4.5 sd with probability 1 - 7e-6
    assert abs(kept - 0.4 * n) < 4.5 * (0.24 * n) ** 0.5, (kept, n)
    again = run_memagent(qs, OracleLLM(tok, keep_probability=0.4, seed=3), MEMORY_CFG)
    assert [t.memories for t in again] == [t.memories for t in some]
    with pytest.raises(ValueError, match="keep_probability"):
        OracleLLM(tok, keep_probability=1.5)


def test_compact_rows_train_the_same_responses_behind_a_shorter_prompt(tok) -> None:
    qs = samples(tok, n=5, chunks=3)
    full, compact = oracle_rows(qs, tok, MEMORY_CFG), compact_oracle_rows(qs, tok, MEMORY_CFG)
    assert [len(r) for r in full] == [len(r) for r in compact] == [4] * 5
    for s, f_rows, c_rows in zip(qs, full, compact):
        ids = tok(s.context, add_special_tokens=False)["input_ids"]
        previous = MEMORY_CFG.initial_memory
        for k, (f, c) in enumerate(zip(f_rows, c_rows)):
            assert f.input_ids[f.prompt_len:] == c.input_ids[c.prompt_len:]
            assert f.response_mask == c.response_mask and sum(c.response_mask) > 0
            assert c.prompt_len < f.prompt_len / 3
            prompt = tok.decode(c.input_ids[:c.prompt_len])
            assert prompt.startswith(s.question + "\n" + previous + "\n")
            if k < 3:  # a memory update shows its chunk; the answer prompt shows the last memory only
                assert tok.decode(ids[k * 32:(k + 1) * 32]) in prompt
                previous = tok.decode(c.input_ids[c.prompt_len:], skip_special_tokens=True).strip()
            else:
                assert prompt.endswith("Answer:")


def test_supervised_updates_stop_once_the_mean_of_five_losses_is_below_the_threshold(demo_dir, tok) -> None:
    model = load_model(demo_dir)
    rows = [r for rs in oracle_rows(samples(tok, n=2, chunks=1), tok, MEMORY_CFG) for r in rs]
    kw = dict(lr=1e-3, pad_id=tok.pad_token_id, device=torch.device("cpu"), budget=4096, desc="t", show=False)
    assert len(supervised_updates(model, lambda u: rows, steps=9, stop_loss=1e9, **kw)) == 5
    assert len(supervised_updates(model, lambda u: rows, steps=7, stop_loss=0.0, **kw)) == 7


def test_supervised_update_does_not_depend_on_the_micro_batch_budget(demo_dir, tok, monkeypatch) -> None:
    # SGD in place of AdamW: Adam's first step is ~lr * sign(g), which turns rounding noise in a near-zero
    # gradient into a full lr-sized difference; with SGD the update is lr * g and shows the gradient itself.
    monkeypatch.setattr(torch.optim, "AdamW", lambda params, lr, weight_decay: torch.optim.SGD(params, lr=lr))
    rows = [r for rs in oracle_rows(samples(tok, n=3, chunks=2), tok, MEMORY_CFG) for r in rs]
    a = load_model(demo_dir)
    b = copy.deepcopy(a)
    kw = dict(steps=1, lr=1.0, pad_id=tok.pad_token_id, device=torch.device("cpu"), desc="t", show=False)
    la = supervised_updates(a, lambda u: rows, budget=100_000, **kw)
    lb = supervised_updates(b, lambda u: rows, budget=300, **kw)
    assert la[0] == pytest.approx(lb[0], rel=1e-6)
    for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(pa, pb, rtol=1e-5, atol=1e-6, msg=name)


def test_both_stages_lower_the_loss_on_fresh_questions(demo_dir, tok) -> None:
    model = load_model(demo_dir)
    cfg = DemoConfig(pretrain_steps=12, pretrain_batch=8, pretrain_stop_loss=0.0, steps=12, batch_questions=8,
                          lr=3e-3)
    kw = dict(device=torch.device("cpu"), budget=8192, show=False)
    pre = compact_pretrain(model, tok, lambda u: samples(tok, n=8, chunks=1, seed=100 + u), MEMORY_CFG, cfg, **kw)
    sft = warm_start(model, tok, samples(tok, n=96, chunks=1, seed=7), MEMORY_CFG, cfg, seed=0, **kw)
    assert len(pre) == len(sft) == 12
    assert sum(pre[-3:]) < sum(pre[:3]) and sum(sft[-3:]) < sum(sft[:3])
