"""Constrained gate decisions (workflow.gate_decoding constrained, docs/gates.md; memagent.rollout.constraints).

A constrained row's first tokens are drawn from the policy restricted to the tokenizations of the offered words and
renormalized at each step, so every decision parses; it records the policy's unconstrained log-probs; rows without
a constraint draw exactly what they would without one; and gate_decoding free sends no constraint at all.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from transformers import PreTrainedModel

import memagent.rollout.llm as llm_module
from memagent.config import load_config
from memagent.model import load_tokenizer, token_logprobs
from memagent.records import ANSWER, MEMORY, ChatRequest, Completion, Sample
from memagent.rollout import SamplingParams, generate
from memagent.rollout.constraints import (
    FREE,
    build_automaton,
    mask_logits,
    sample_constrained,
    tokenize_prefixes,
)
from memagent.rollout.gates import ANSWER_NOW, KEEP, UNPARSED, UPDATE, decision_prefixes, update_line_tokens
from memagent.rollout.llm import LocalLLM
from memagent.rollout.prompts import WorkflowConfig, render_memory_update, user_message
from memagent.rollout.workflow import run_memagent

DOCUMENT = "The capital of France is Paris. The key is under the blue stone. Document 12 has a library.\n" * 3
QUESTION = "Where is the key?"
SMOLLM2 = Path(__file__).resolve().parents[2] / "models" / "smollm2-135m-instruct"


def _config(gates: str = "both", **overrides) -> WorkflowConfig:
    base = dict(chunk_tokens=24, memory_tokens=8, answer_tokens=6, max_chunks=None, question_tokens=64, gates=gates)
    return WorkflowConfig(**{**base, **overrides})


def _gated_prompt(llm: LocalLLM) -> list[int]:
    text = render_memory_update(QUESTION, "No previous memory", "The key is under the blue stone.", gates="both")
    return llm.render(ChatRequest(user_message(text), 8))


def _reply_ids(tokenizer, reply: str) -> list[int]:
    """The ids the chat template gives an assistant reply, after the generation prompt."""
    messages = [{"role": "user", "content": QUESTION}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    full = tokenizer.apply_chat_template(messages + [{"role": "assistant", "content": reply}], tokenize=True,
                                         return_dict=False)
    assert full[: len(prompt)] == prompt
    return full[len(prompt):]


# ---------------------------------------------------------------- the prefixes and the automaton


def test_prefixes_are_spelled_as_the_chat_template_spells_a_reply(tiny_tokenizer) -> None:
    texts = decision_prefixes("both")
    assert texts == (KEEP, f"{UPDATE}\n", ANSWER_NOW)
    for text, ids in zip(texts, tokenize_prefixes(tiny_tokenizer, texts)):
        assert _reply_ids(tiny_tokenizer, text + "the key is under the stone")[: len(ids)] == list(ids)
    assert len(tokenize_prefixes(tiny_tokenizer, (f"{UPDATE}\n",))[0]) == update_line_tokens(tiny_tokenizer)


@pytest.mark.skipif(not SMOLLM2.is_dir(), reason="models/smollm2-135m-instruct absent (make smollm2)")
def test_smollm2_spells_the_words_in_two_two_and_three_tokens_as_in_its_chat_template() -> None:
    tokenizer = load_tokenizer(SMOLLM2)
    texts = decision_prefixes("both")
    prefixes = tokenize_prefixes(tokenizer, texts)
    assert [tokenizer.convert_ids_to_tokens(list(ids)) for ids in prefixes] == [
        ["KE", "EP"], ["UPDATE", "Ċ"], ["AN", "SW", "ER"]]
    for text, ids in zip(texts, prefixes):
        assert _reply_ids(tokenizer, text + "the key is under the stone")[: len(ids)] == list(ids)


def test_a_prefix_that_another_extends_token_by_token_is_refused() -> None:
    with pytest.raises(ValueError, match="proper token prefix"):
        build_automaton([((5, 6), (5, 6, 7))], 16, torch.device("cpu"))
    with pytest.raises(ValueError, match="outside the 16 sampled tokens"):
        build_automaton([((5, 16),)], 16, torch.device("cpu"))


def test_the_mask_renormalizes_the_policy_over_a_nodes_children_and_leaves_free_rows_untouched() -> None:
    logits = torch.randn(3, 16, generator=torch.Generator().manual_seed(0))
    automaton = build_automaton([((5, 6), (5, 7), (9,)), None, ((2,),)], 16, torch.device("cpu"))
    masked = mask_logits(logits, automaton.start, automaton)
    p = logits[0].softmax(-1)
    expected = torch.zeros(16)
    expected[[5, 9]] = p[[5, 9]] / p[[5, 9]].sum()
    torch.testing.assert_close(masked[0].softmax(-1), expected)
    assert torch.equal(masked[1], logits[1]) and masked[2].softmax(-1)[2] == 1  # FREE row as is; a forced step


def test_constrained_draws_follow_the_policy_renormalized_within_the_trie() -> None:
    # A trie that branches twice: at the root (5 or 9) and after 5 (6 or 7); 7 forces 8. Every row shares one
    # distribution per step, so the draws' frequencies estimate the constrained distribution; 5 binomial sigma.
    rows, width, temperature = 20000, 300, 0.7
    g = torch.Generator().manual_seed(0)
    automaton = build_automaton([((5, 6), (5, 7, 8), (9,))] * rows, width, torch.device("cpu"))
    state, params = automaton.start, SamplingParams(temperature=temperature)
    steps = [torch.randn(width, generator=g) * 2 for _ in range(3)]

    def check(ids: torch.Tensor, step_logits: torch.Tensor, allowed: list[int]) -> None:
        p = (step_logits / temperature).softmax(-1)[allowed]
        for token, share in zip(allowed, (p / p.sum()).tolist()):
            seen = float((ids == token).float().mean())
            assert abs(seen - share) < 5 * math.sqrt(share * (1 - share) / len(ids)) + 1e-9, (token, seen, share)
        assert bool(torch.isin(ids, torch.tensor(allowed)).all())

    ids, logprobs, state = sample_constrained(steps[0].expand(rows, -1), state, automaton, params, g)
    check(ids, steps[0], [5, 9])
    policy = (steps[0] / temperature).log_softmax(-1)
    torch.testing.assert_close(logprobs, policy[ids])  # the unconstrained policy's, not the renormalized one
    assert bool((state[ids == 9] == FREE).all()) and bool((state[ids == 5] != FREE).all())
    first = ids
    ids, logprobs, state = sample_constrained(steps[1].expand(rows, -1), state, automaton, params, g)
    check(ids[first == 5], steps[1], [6, 7])
    assert int(torch.isin(ids[first == 9], torch.tensor([6, 7])).sum()) < 0.5 * int((first == 9).sum())  # free rows
    second = ids
    ids, logprobs, state = sample_constrained(steps[2].expand(rows, -1), state, automaton, params, g)
    forced = (first == 5) & (second == 7)
    assert bool((ids[forced] == 8).all()) and bool((state == FREE).all())
    policy = (steps[2] / temperature).log_softmax(-1)
    assert bool((logprobs[forced] == policy[8]).all()) and float(policy[8]) < -1  # forced, yet the policy's log-prob


# ---------------------------------------------------------------- the engine


def _random_prompts(model: PreTrainedModel, n: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(3, model.config.vocab_size, (4 + i,), generator=g).tolist() for i in range(n)]


def test_unconstrained_rows_of_a_mixed_batch_are_byte_identical_to_a_batch_without_constraints(
    model, tiny_tokenizer
) -> None:
    prompts = _random_prompts(model, 6)
    prefixes = tokenize_prefixes(tiny_tokenizer, decision_prefixes("both"))

    def run(allowed):
        return generate(model, prompts, max_new_tokens=10, eos_token_id=None, params=SamplingParams(),
                        generator=torch.Generator().manual_seed(3), allowed_prefixes=allowed)

    plain, mixed = run(None), run([prefixes, None, None, prefixes, None, None])
    for row in (1, 2, 4, 5):
        assert mixed.tokens[row] == plain.tokens[row] and torch.equal(mixed.logprobs[row], plain.logprobs[row])
    for row in (0, 3):
        assert any(tuple(mixed.tokens[row][: len(p)]) == p for p in prefixes)
    none_at_all = run([None] * 6)  # no row constrained: the unconstrained code path, the same draws
    assert none_at_all.tokens == plain.tokens
    assert all(torch.equal(a, b) for a, b in zip(none_at_all.logprobs, plain.logprobs))


def test_recorded_logprobs_are_the_unconstrained_policys_at_the_sampling_temperature(model, tiny_tokenizer) -> None:
    llm = LocalLLM(model, tiny_tokenizer)
    prompt, temperature = _gated_prompt(llm), 0.7
    prefixes = tokenize_prefixes(tiny_tokenizer, decision_prefixes("both"))
    out = generate(model, [prompt] * 8, max_new_tokens=9, eos_token_id=None, params=SamplingParams(temperature),
                   generator=torch.Generator().manual_seed(0), allowed_prefixes=[prefixes] * 8)
    for tokens, logprobs in zip(out.tokens, out.logprobs):
        ids = torch.tensor([prompt + tokens])
        recomputed = token_logprobs(model, ids, torch.ones_like(ids), temperature=temperature).logprobs[0, len(prompt):]
        torch.testing.assert_close(logprobs, recomputed, atol=2e-5, rtol=0)
        word = next(p for p in prefixes if tuple(tokens[: len(p)]) == p)
        # Every letter after the first is forced (log-prob 0 under the mask); the policy's is well below 0.
        assert float(logprobs[1 : len(word)].max()) < -1e-3


def test_a_greedy_constrained_row_takes_the_most_likely_allowed_word(model, tiny_tokenizer) -> None:
    llm = LocalLLM(model, tiny_tokenizer)
    prompt = _gated_prompt(llm)
    prefixes = tokenize_prefixes(tiny_tokenizer, decision_prefixes("both"))
    out = generate(model, [prompt], max_new_tokens=7, eos_token_id=None, params=SamplingParams(temperature=0.0),
                   allowed_prefixes=[prefixes])
    with torch.no_grad():
        policy = model(torch.tensor([prompt])).logits[0, -1].log_softmax(-1)
    firsts = [p[0] for p in prefixes]
    best = firsts[int(policy[firsts].argmax())]
    assert out.tokens[0][0] == best
    torch.testing.assert_close(out.logprobs[0][0], policy[best])


def test_decisions_follow_the_policys_first_token_renormalized_over_the_offered_words(model, tiny_tokenizer) -> None:
    # The tiny tokenizer's words part at their first letter and every later letter is forced, so the share of
    # each word is the policy's first-token probability renormalized over K, U and A. 2000 rows, 5 sigma.
    llm, rows = LocalLLM(model, tiny_tokenizer), 2000
    prompt = _gated_prompt(llm)
    prefixes = tokenize_prefixes(tiny_tokenizer, decision_prefixes("both"))
    out = generate(model, [prompt] * rows, max_new_tokens=7, eos_token_id=None, params=SamplingParams(),
                   generator=torch.Generator().manual_seed(0), allowed_prefixes=[prefixes] * rows)
    with torch.no_grad():
        p = model(torch.tensor([prompt])).logits[0, -1].softmax(-1)[[q[0] for q in prefixes]]
    shares = (p / p.sum()).tolist()
    assert min(shares) > 0.05  # a spread worth testing
    for prefix, share in zip(prefixes, shares):
        seen = sum(tuple(t[: len(prefix)]) == prefix for t in out.tokens) / rows
        assert abs(seen - share) < 5 * math.sqrt(share * (1 - share) / rows), (prefix, seen, share)


# ---------------------------------------------------------------- the workflow


class RecordingLLM:
    """A LocalLLM that records every request it answers."""

    def __init__(self, inner: LocalLLM) -> None:
        self.inner, self.tokenizer, self.requests = inner, inner.tokenizer, []

    def complete(self, requests: list[ChatRequest]) -> list[Completion]:
        self.requests += requests
        return self.inner.complete(requests)


@pytest.mark.parametrize("gates", ["update", "exit", "both"])
def test_constrained_rows_always_parse_on_the_tiny_random_model(model, tiny_tokenizer, gates) -> None:
    llm = LocalLLM(model, tiny_tokenizer, generator=torch.Generator().manual_seed(0))
    trajectories = run_memagent([Sample(DOCUMENT, QUESTION, ["stone"])] * 3, llm, _config(gates), group_size=4)
    decisions = [d for t in trajectories for d in t.decisions]
    assert len(decisions) >= 12 and UNPARSED not in decisions and len(set(decisions)) > 1
    line = update_line_tokens(tiny_tokenizer)
    for c in (c for t in trajectories for c in t.conversations if c.kind == MEMORY):
        if c.decision == UPDATE:  # the memory starts on the line after the word, which took the canonical tokens
            assert tiny_tokenizer.decode(c.response_ids[:line]) == f"{UPDATE}\n" and c.decision_tokens == line
        else:  # KEEP and ANSWER: the word and nothing more
            assert tiny_tokenizer.decode(c.response_ids, skip_special_tokens=True) == c.decision and c.finished


def test_constrained_requests_carry_the_offered_words_and_free_ones_carry_nothing(model, tiny_tokenizer) -> None:
    for decoding, expected in (("constrained", decision_prefixes("exit")), ("free", ())):
        llm = RecordingLLM(LocalLLM(model, tiny_tokenizer, generator=torch.Generator().manual_seed(0)))
        run_memagent([Sample(DOCUMENT, QUESTION, ["stone"])], llm, _config("exit", gate_decoding=decoding))
        updates = [r for r in llm.requests if "<section>" in r.messages[-1]["content"]]
        assert updates and all(r.allowed_prefixes == expected for r in updates)
        assert all(r.allowed_prefixes == () for r in llm.requests if r not in updates)  # the answer round
    llm = RecordingLLM(LocalLLM(model, tiny_tokenizer))
    run_memagent([Sample(DOCUMENT, QUESTION, ["stone"])], llm, _config("none"))
    assert all(r.allowed_prefixes == () for r in llm.requests)  # MemAgent's requests, whatever gate_decoding says


def test_free_decoding_reaches_the_engine_exactly_as_before_constraints_existed(model, tiny_tokenizer,
                                                                                monkeypatch) -> None:
    seen = []

    def spy(*args, **kwargs):
        seen.append(kwargs["allowed_prefixes"])
        return real(*args, **kwargs)

    real = llm_module.generate
    monkeypatch.setattr(llm_module, "generate", spy)
    llm = LocalLLM(model, tiny_tokenizer, generator=torch.Generator().manual_seed(0))
    free = run_memagent([Sample(DOCUMENT, QUESTION, ["stone"])], llm, _config(gate_decoding="free"), group_size=3)
    assert seen and all(prefixes is None for prefixes in seen)  # generate's unconstrained path, untouched
    assert UNPARSED in [d for t in free for d in t.decisions]  # what the constraint is for
    assert free[0].conversations[-1].kind == ANSWER


def test_gate_decoding_is_named_when_it_is_neither_constrained_nor_free() -> None:
    assert WorkflowConfig().gate_decoding == "constrained"
    with pytest.raises(ValueError, match="workflow.gate_decoding='loose': expected one of constrained, free"):
        WorkflowConfig(gate_decoding="loose")
    with pytest.raises(ValueError, match="workflow.gate_decoding='loose'"):
        load_config(["--preset", "smoke", "--workflow.gates", "both", "--workflow.gate-decoding", "loose"])
    assert load_config(["--preset", "smoke", "--workflow.gate-decoding", "free"]).workflow.gate_decoding == "free"
