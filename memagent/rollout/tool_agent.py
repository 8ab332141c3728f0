"""A multi-turn tool-calling agent: a calculator the model may call with `<tool>expression</tool>`.

It shows how an agent with forced (non-sampled) tokens fits the Conversation record. The model answers; if its
turn ended with EOS and contains `<tool>expr</tool>`, the agent evaluates expr with a small arithmetic parser
(numbers, + - * /, parentheses; never `eval`) and sends `<tool_response>result</tool_response>` back as a user
turn; at most `max_turns` assistant turns.

Prompt/response split. The episode is ONE Conversation:
- prompt_ids: the first request's prompt as the backend rendered it (chat template + generation prompt);
- response: turn 1's sampled ids (EOS included, mask 1, their behaviour log-probs), then the forced ids the
  chat template puts between that EOS and the next generation prompt, e.g. ChatML's
  "\\n<|im_start|>user\\n<tool_response>5</tool_response><|im_end|>\\n<|im_start|>assistant\\n" (mask 0,
  log-prob 0), then turn 2's sampled ids, and so on.
The forced text is the difference of the template's renderings before and after the tool turn, tokenized with
the policy tokenizer (`add_special_tokens=False`). So prompt + response is exactly what the backend fed the
model for the last turn whenever the template renders an assistant turn verbatim and re-encoding a decoded
turn gives back its sampled ids (the usual multi-turn caveat; MemAgent itself sidesteps it, every call being a
fresh single-turn chat). A template that does not render the assistant content verbatim is refused with a
ValueError. A turn that ends on a stop token other than the template's end-of-turn (e.g. `<|endoftext|>`) ends
the episode, as does a cut turn.
"""

from __future__ import annotations

import re
from collections.abc import Generator
from fractions import Fraction

import torch
from transformers import PreTrainedTokenizerBase

from memagent.records import TURN, ChatRequest, Completion, Conversation
from memagent.rollout.agents import AgentResult
from memagent.rollout.prompts import user_message

CALCULATOR_PROMPT = """\
Solve the problem below. You may use a calculator: write <tool>expression</tool> with numbers, + - * / and \
parentheses, then end your turn; the result comes back as <tool_response>result</tool_response>. Put the \
final answer in \\boxed{{}}.

Problem: {question}"""
"""The first user message; field question."""

MAX_EXPRESSION_CHARS = 200
"""Longer tool calls are refused, which bounds the parser's work and recursion depth."""

_TOOL_CALL = re.compile(r"<tool>(.*?)</tool>", re.DOTALL)
_ARITH_TOKEN = re.compile(r"\s*(?:(\d+\.?\d*|\.\d+)|([-+*/()]))")


class CalculatorError(ValueError):
    """A tool call the calculator cannot evaluate; its message becomes the tool response."""


class _Parser:
    """Recursive descent over: expr = term (('+'|'-') term)*; term = unary (('*'|'/') unary)*;
    unary = ('+'|'-') unary | number | '(' expr ')'. Exact rational arithmetic (Fraction)."""

    def __init__(self, text: str) -> None:
        self.tokens: list[str] = []
        pos, text = 0, text.rstrip()
        while pos < len(text):
            match = _ARITH_TOKEN.match(text, pos)
            if match is None:
                raise CalculatorError(f"unexpected character {text[pos:].lstrip()[:1]!r}")
            self.tokens.append(match.group(1) or match.group(2))
            pos = match.end()
        self.pos = 0

    def _peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def _take(self) -> str:
        token = self._peek()
        if token is None:
            raise CalculatorError("unexpected end of expression")
        self.pos += 1
        return token

    def parse(self) -> Fraction:
        value = self._expr()
        if self._peek() is not None:
            raise CalculatorError(f"unexpected {self._peek()!r}")
        return value

    def _expr(self) -> Fraction:
        value = self._term()
        while self._peek() in ("+", "-"):
            value = value + self._term() if self._take() == "+" else value - self._term()
        return value

    def _term(self) -> Fraction:
        value = self._unary()
        while self._peek() in ("*", "/"):
            if self._take() == "*":
                value *= self._unary()
            else:
                divisor = self._unary()
                if divisor == 0:
                    raise CalculatorError("division by zero")
                value /= divisor
        return value

    def _unary(self) -> Fraction:
        token = self._take()
        if token in ("+", "-"):
            value = self._unary()
            return value if token == "+" else -value
        if token == "(":
            value = self._expr()
            if self._take() != ")":
                raise CalculatorError("missing ')'")
            return value
        if token in ("*", "/", ")"):
            raise CalculatorError(f"unexpected {token!r}")
        return Fraction(token)


def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression exactly; an integer prints as one, anything else with 12 significant
    digits. Raises CalculatorError (a ValueError) on anything that is not such an expression."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    value = _Parser(expression).parse()
    return str(value.numerator) if value.denominator == 1 else f"{float(value):.12g}"


def find_tool_call(text: str) -> str | None:
    """The expression of the first `<tool>...</tool>` in a turn, or None."""
    match = _TOOL_CALL.search(text)
    return None if match is None else match.group(1)


def tool_response(expression: str) -> str:
    """The user-turn content answering a tool call: the result, or `error: ...` when it does not evaluate."""
    try:
        result = calculate(expression)
    except CalculatorError as err:
        result = f"error: {err}"
    return f"<tool_response>{result}</tool_response>"


def forced_ids(
    tokenizer: PreTrainedTokenizerBase,
    before: list[dict[str, str]],
    after: list[dict[str, str]],
    turn: Completion,
) -> list[int] | None:
    """Ids the chat template puts between a sampled turn's EOS and the next generation prompt's end.

    before: the messages the turn was sampled from; after: before + the assistant turn + the tool turn. None
    when the turn ended on a stop token that is not the template's end-of-turn (see the module docstring).
    """
    prompt = tokenizer.apply_chat_template(before, tokenize=False, add_generation_prompt=True)
    rendered = tokenizer.apply_chat_template(after, tokenize=False, add_generation_prompt=True)
    head = prompt + turn.text
    if not rendered.startswith(head):
        raise ValueError(
            "the chat template does not render the assistant turn verbatim after the generation prompt; "
            "calculator_agent needs one that does (e.g. ChatML / Qwen2.5)"
        )
    end_of_turn = tokenizer.decode(turn.response_ids[-1:])
    rest = rendered[len(head) :]
    if not rest.startswith(end_of_turn):
        return None
    return tokenizer(rest[len(end_of_turn) :], add_special_tokens=False)["input_ids"]


def calculator_agent(
    question: str, tokenizer: PreTrainedTokenizerBase, *, max_new_tokens: int, max_turns: int = 4
) -> Generator[ChatRequest, Completion, AgentResult]:
    """Answer `question`, calling the calculator up to max_turns - 1 times; returns ONE TURN conversation.

    Needs a token-level backend (LocalLLM): the conversation is built from the completions' ids and log-probs.
    """
    if max_turns < 1:
        raise ValueError(f"calculator_agent: max_turns must be >= 1, got {max_turns}")
    messages = list(user_message(CALCULATOR_PROMPT.format(question=question)))
    prompt_ids: list[int] = []
    response_ids: list[int] = []
    mask: list[int] = []
    logprobs: list[torch.Tensor] = []
    for turn_index in range(max_turns):
        turn = yield ChatRequest(messages=tuple(messages), max_new_tokens=max_new_tokens)
        if turn.error is not None:
            return AgentResult(conversations=[], answer="", error=turn.error)
        if turn.logprobs is None:
            raise ValueError(
                "calculator_agent needs completions with token ids and log-probs (e.g. LocalLLM)"
            )
        if turn_index == 0:
            prompt_ids = list(turn.prompt_ids)
        response_ids += turn.response_ids
        mask += [1] * len(turn.response_ids)
        logprobs.append(turn.logprobs.float())

        call = find_tool_call(turn.text)
        if call is None or not turn.finished or turn_index == max_turns - 1:
            break
        after = [*messages, {"role": "assistant", "content": turn.text}, *user_message(tool_response(call))]
        forced = forced_ids(tokenizer, messages, after, turn)
        if forced is None:
            break
        response_ids += forced
        mask += [0] * len(forced)
        logprobs.append(torch.zeros(len(forced), dtype=torch.float32))
        messages = after

    conversation = Conversation(
        prompt_ids=prompt_ids,
        response_ids=response_ids,
        response_mask=mask,
        logprobs=torch.cat(logprobs),
        finished=turn.finished,
        kind=TURN,
        text=tokenizer.decode(response_ids, skip_special_tokens=True),
    )
    return AgentResult(conversations=[conversation], answer=turn.text)
