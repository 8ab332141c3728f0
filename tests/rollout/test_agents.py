"""The LLM backend, the single-turn agent and the calculator tool agent."""

from __future__ import annotations

import pytest
import torch

from memagent.records import TURN, ChatRequest, Completion
from memagent.rollout.agents import AgentResult, single_turn_agent
from memagent.rollout.llm import LocalLLM, stop_token_ids
from memagent.rollout.sampling import SamplingParams
from memagent.rollout.scheduler import run_agents
from memagent.rollout.tool_agent import CalculatorError, calculate, calculator_agent, find_tool_call

GREEDY = SamplingParams(temperature=0.0)


class ScriptedLLM:
    """A backend whose replies are fixed texts, tokenized with the real tokenizer and ended with <|im_end|>.

    It renders prompts exactly as LocalLLM does, so a test can compare the recorded layout with what a model
    would have been fed at every turn.
    """

    def __init__(self, tokenizer, replies: list[str]) -> None:
        self.tokenizer = tokenizer
        self.replies = list(replies)
        self.prompts: list[list[int]] = []
        self.eos = tokenizer.convert_tokens_to_ids("<|im_end|>")

    def complete(self, requests: list[ChatRequest]) -> list[Completion]:
        out = []
        for request in requests:
            prompt = self.tokenizer.apply_chat_template(
                list(request.messages), add_generation_prompt=True, tokenize=True, return_dict=False
            )
            self.prompts.append(prompt)
            text = self.replies.pop(0)
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"] + [self.eos]
            logprobs = -torch.arange(1, len(ids) + 1, dtype=torch.float32) / 10
            out.append(
                Completion(text=text, prompt_ids=prompt, response_ids=ids, logprobs=logprobs, finished=True)
            )
        return out


class FailingLLM:
    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer

    def complete(self, requests: list[ChatRequest]) -> list[Completion]:
        return [Completion(text="", error="connection refused") for _ in requests]


def test_stop_ids_are_eos_then_chatml_end_tokens(tiny_tokenizer) -> None:
    im_end, endoftext = tiny_tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    assert stop_token_ids(tiny_tokenizer) == [im_end, endoftext]


def test_local_prompt_ids_decode_to_the_rendered_chat(tiny_model, tiny_tokenizer) -> None:
    llm = LocalLLM(tiny_model, tiny_tokenizer, params=GREEDY)
    request = ChatRequest(messages=({"role": "user", "content": "What is 2 + 3?"},), max_new_tokens=4)
    [completion] = llm.complete([request])
    expected = tiny_tokenizer.apply_chat_template(
        list(request.messages), tokenize=False, add_generation_prompt=True
    )
    assert tiny_tokenizer.decode(completion.prompt_ids) == expected
    assert completion.text == tiny_tokenizer.decode(completion.response_ids, skip_special_tokens=True)


def test_local_backend_honours_each_requests_max_new_tokens(tiny_model, tiny_tokenizer) -> None:
    llm = LocalLLM(tiny_model, tiny_tokenizer, params=GREEDY)
    requests = [
        ChatRequest(messages=({"role": "user", "content": f"count to {n}"},), max_new_tokens=n)
        for n in (1, 3, 6)
    ]
    completions = llm.complete(requests)
    for request, completion in zip(requests, completions):
        assert len(completion.response_ids) <= request.max_new_tokens
        assert completion.logprobs.shape == (len(completion.response_ids),)
        assert completion.finished == (completion.response_ids[-1] in llm.eos_token_ids)
    assert llm.complete([]) == []


def test_single_turn_agent_returns_one_fully_sampled_turn(tiny_model, tiny_tokenizer) -> None:
    llm = LocalLLM(tiny_model, tiny_tokenizer, params=GREEDY)
    [result] = run_agents([single_turn_agent("Say hello.", max_new_tokens=5)], llm)
    [conversation] = result.conversations
    assert conversation.kind == TURN
    assert conversation.response_mask == [1] * len(conversation.response_ids)
    assert conversation.logprobs.shape == (len(conversation.response_ids),)
    assert bool((conversation.logprobs <= 0).all())
    assert result.answer == conversation.text


def test_single_turn_system_prompt_replaces_the_default(tiny_tokenizer) -> None:
    llm = ScriptedLLM(tiny_tokenizer, ["hi"])
    run_agents([single_turn_agent("Say hello.", max_new_tokens=5, system="Be brief.")], llm)
    prompt = tiny_tokenizer.decode(llm.prompts[0])
    assert prompt.startswith("<|im_start|>system\nBe brief.<|im_end|>") and "helpful assistant" not in prompt


def test_failed_request_is_reported_not_dropped(tiny_tokenizer) -> None:
    [result] = run_agents([single_turn_agent("q", max_new_tokens=5)], FailingLLM(tiny_tokenizer))
    assert result == AgentResult(conversations=[], answer="", error="connection refused")


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("2 + 3 * 4", "14"),
        ("(2 + 3) * 4", "20"),
        ("-3 - -2", "-1"),
        ("7 / 2", "3.5"),
        ("1/3", "0.333333333333"),
        (" 1.5 * 2 ", "3"),
        ("10 - 2 - 3", "5"),
        ("8 / 4 / 2", "1"),
    ],
)
def test_calculate_follows_arithmetic_precedence(expression: str, value: str) -> None:
    assert calculate(expression) == value


@pytest.mark.parametrize(
    "expression", ["__import__('os')", "2 ** 3", "1 / 0", "(1 + 2", "1 +", "", "3 4", "9" * 201]
)
def test_calculate_refuses_anything_but_arithmetic(expression: str) -> None:
    with pytest.raises(CalculatorError):
        calculate(expression)


def test_find_tool_call_takes_the_first_call() -> None:
    assert find_tool_call("let me see <tool>2+2</tool> and <tool>3</tool>") == "2+2"
    assert find_tool_call("no call here") is None


def test_tool_tokens_have_mask_zero_and_logprob_zero(tiny_tokenizer) -> None:
    replies = ["I will compute. <tool>2 + 3 * 4</tool>", "So \\boxed{14}."]
    llm = ScriptedLLM(tiny_tokenizer, replies)
    [result] = run_agents([calculator_agent("What is 2 + 3 * 4?", tiny_tokenizer, max_new_tokens=32)], llm)
    [conversation] = result.conversations
    first, second = (tiny_tokenizer(r, add_special_tokens=False)["input_ids"] + [llm.eos] for r in replies)
    n_forced = len(conversation.response_ids) - len(first) - len(second)
    assert n_forced > 0
    assert conversation.response_mask == [1] * len(first) + [0] * n_forced + [1] * len(second)
    forced = slice(len(first), len(first) + n_forced)
    assert bool((conversation.logprobs[forced] == 0).all())
    assert bool((conversation.logprobs[: len(first)] < 0).all()) and bool(
        (conversation.logprobs[-len(second) :] < 0).all()
    )
    forced_text = tiny_tokenizer.decode(conversation.response_ids[forced])
    assert (
        forced_text
        == "\n<|im_start|>user\n<tool_response>14</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    # The layout is exactly what the backend rendered for the last turn.
    assert conversation.prompt_ids == llm.prompts[0]
    assert conversation.prompt_ids + conversation.response_ids[: -len(second)] == llm.prompts[1]
    assert result.answer == "So \\boxed{14}." and conversation.finished


def test_tool_agent_stops_after_max_turns(tiny_tokenizer) -> None:
    llm = ScriptedLLM(tiny_tokenizer, ["<tool>1+1</tool>", "<tool>2+2</tool>", "<tool>3+3</tool>"])
    [result] = run_agents([calculator_agent("q", tiny_tokenizer, max_new_tokens=16, max_turns=2)], llm)
    assert len(llm.prompts) == 2 and len(llm.replies) == 1
    assert "<tool_response>2</tool_response>" in result.conversations[0].text
    assert "<tool_response>4</tool_response>" not in result.conversations[0].text


def test_tool_errors_come_back_as_tool_responses(tiny_tokenizer) -> None:
    llm = ScriptedLLM(tiny_tokenizer, ["<tool>1/0</tool>", "done"])
    [result] = run_agents([calculator_agent("q", tiny_tokenizer, max_new_tokens=16)], llm)
    assert "<tool_response>error: division by zero</tool_response>" in result.conversations[0].text


def test_tool_agent_on_the_tiny_model_masks_exactly_the_sampled_tokens(tiny_model, tiny_tokenizer) -> None:
    llm = LocalLLM(tiny_model, tiny_tokenizer, params=GREEDY)
    [result] = run_agents([calculator_agent("What is 6 * 7?", tiny_tokenizer, max_new_tokens=8)], llm)
    [conversation] = result.conversations
    assert conversation.logprobs.shape == (len(conversation.response_ids),)
    sampled = torch.tensor(conversation.response_mask, dtype=torch.bool)
    assert bool((conversation.logprobs[~sampled] == 0).all())
    assert conversation.num_trained_tokens >= 1
