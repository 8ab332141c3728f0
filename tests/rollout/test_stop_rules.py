"""Stop rules of the engine (the gate decisions KEEP and ANSWER, docs/gates.md): a row ends where its rule says, with
exactly the tokens and log-probs it sampled up to there, and every other row decodes as if no rule existed."""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from memagent.records import ChatRequest
from memagent.rollout import SamplingParams, generate
from memagent.rollout.llm import LocalLLM, whole_response_stop
from memagent.rollout.prompts import user_message

GREEDY = SamplingParams(temperature=0.0)


def _prompts(model: PreTrainedModel, lengths: tuple[int, ...] = (5, 9, 3)) -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(3, model.config.vocab_size, (n,), generator=g).tolist() for n in lengths]


def test_a_rule_ends_its_row_with_the_prefix_it_sampled(model: PreTrainedModel) -> None:
    prompts = _prompts(model)
    free = generate(model, prompts, max_new_tokens=10, eos_token_id=None, params=GREEDY)
    asked: list[list[int]] = []

    def after_three(ids: list[int]) -> bool | None:
        asked.append(list(ids))
        return True if len(ids) == 3 else None

    never = lambda ids: False  # noqa: E731  (decides at once: never asked again)
    ruled = generate(model, prompts, max_new_tokens=10, eos_token_id=None, params=GREEDY,
                     stop_rules=[after_three, None, never])
    assert ruled.tokens[0] == free.tokens[0][:3] and ruled.finished[0]
    torch.testing.assert_close(ruled.logprobs[0], free.logprobs[0][:3])
    assert asked == [free.tokens[0][:1], free.tokens[0][:2], free.tokens[0][:3]]  # its own tokens, one at a time
    for row in (1, 2):  # no rule, or a rule that gave up: decoded as without rules, cut at the limit
        assert ruled.tokens[row] == free.tokens[row] and not ruled.finished[row]
        torch.testing.assert_close(ruled.logprobs[row], free.logprobs[row])


def test_a_row_stopped_by_eos_is_not_asked_again(model: PreTrainedModel) -> None:
    # Five rows: one stopped row stays resident (it is below the compaction fraction), yet its rule is done.
    prompts = _prompts(model, (5, 9, 3, 7, 4))
    free = generate(model, prompts[:1], max_new_tokens=8, eos_token_id=None, params=GREEDY)
    eos = free.tokens[0][1]
    asked: list[int] = []
    out = generate(model, prompts, max_new_tokens=8, eos_token_id=eos, params=GREEDY,
                   stop_rules=[lambda ids: asked.append(len(ids)), None, None, None, None])
    assert out.tokens[0][-1] == eos and out.finished[0] and asked == list(range(1, len(out.tokens[0]) + 1))
    assert max(len(t) for t in out.tokens) > len(out.tokens[0])  # other rows went on after it stopped


def test_stop_texts_end_a_local_completion_once_the_response_is_one_of_them(model, tiny_tokenizer) -> None:
    llm = LocalLLM(model, tiny_tokenizer, params=GREEDY)
    request = ChatRequest(messages=user_message("Where is the key?"), max_new_tokens=12)
    [free] = llm.complete([request])
    cut = next(n for n in range(2, len(free.response_ids))
               if tiny_tokenizer.decode(free.response_ids[:n], skip_special_tokens=True).strip())
    word = tiny_tokenizer.decode(free.response_ids[:cut], skip_special_tokens=True).strip()
    [stopped] = llm.complete([ChatRequest(request.messages, 12, stop_texts=(word, "never-sampled"))])
    assert stopped.text.strip() == word and stopped.finished
    assert stopped.response_ids == free.response_ids[: len(stopped.response_ids)]
    torch.testing.assert_close(stopped.logprobs, free.logprobs[: len(stopped.response_ids)])


def test_the_text_rule_waits_on_prefixes_and_gives_up_on_anything_else(tiny_tokenizer) -> None:
    rule = whole_response_stop(tiny_tokenizer, ("KEEP", "ANSWER"))
    ids = lambda text: tiny_tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    assert rule(ids(" KE")) is None and rule(ids("KEEP")) is True and rule(ids("\nANSWER ")) is True
    assert rule(ids("UPDATE")) is False and rule(ids("KEEPS")) is False and rule([]) is None
