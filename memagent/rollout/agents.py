"""The agent interface: an agent is a plain generator function of one sample.

An agent `yield`s a `ChatRequest`, receives the backend's `Completion` through `send()`, and finally `return`s
an `AgentResult` (its conversations as token records, and its answer text). It never calls a model itself, so
the same agent runs on the local engine or on an HTTP server, and `run_agents` (scheduler.py) can batch the
pending requests of many agents into one backend call. This is MemAgent's "agent as a function"
(MemAgent's `AsyncRAgent.rollout`) without asyncio: a generator's suspension point plays the role of
`await`.

    def echo_agent(question):
        completion = yield ChatRequest(user_message(question), max_new_tokens=64)
        return AgentResult([conversation_from_completion(completion, kind=TURN)], completion.text)

A failed request (`Completion.error`, set by HTTP backends) ends the agent with `AgentResult.error` set and
the conversations gathered so far: the caller counts it as a failure, never drops it.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import TypeVar

import torch

from memagent.records import TURN, ChatRequest, Completion, Conversation
from memagent.rollout.prompts import user_message

R = TypeVar("R")
Agent = Generator[ChatRequest, Completion, R]
"""A running agent: yields requests, is sent completions, returns its result (R, usually AgentResult)."""


@dataclass
class AgentResult:
    """What an agent returns once it is done."""

    conversations: list[Conversation]
    """Its independent LLM calls as token records, in the order they were made."""
    answer: str
    """The final answer text ("" when the agent failed)."""
    error: str | None = None
    """The backend's error message when a request failed and the agent stopped early; None on success."""


def conversation_from_completion(
    completion: Completion, *, kind: str, chunk_index: int = -1, text: str | None = None
) -> Conversation:
    """A single-turn Conversation from a completion: every response token was sampled, so the mask is all 1.

    `text` defaults to the completion's text. A text-only completion (an HTTP backend) gives empty token
    fields; a completion with response ids but no log-probs is refused, since the trainer could not use it.
    """
    n = len(completion.response_ids)
    if completion.logprobs is None:
        if n:
            raise ValueError(f"completion has {n} response ids but no logprobs; the backend must return both")
        logprobs = torch.zeros(0, dtype=torch.float32)
    else:
        logprobs = completion.logprobs.float()
    return Conversation(
        prompt_ids=list(completion.prompt_ids),
        response_ids=list(completion.response_ids),
        response_mask=[1] * n,
        logprobs=logprobs,
        finished=completion.finished,
        kind=kind,
        chunk_index=chunk_index,
        text=completion.text if text is None else text,
    )


def single_turn_agent(
    prompt: str, *, max_new_tokens: int, system: str | None = None
) -> Generator[ChatRequest, Completion, AgentResult]:
    """Ask once; return one TURN conversation. `system` replaces the chat template's default system prompt."""
    messages = user_message(prompt)
    if system is not None:
        messages = ({"role": "system", "content": system}, *messages)
    completion = yield ChatRequest(messages=messages, max_new_tokens=max_new_tokens)
    if completion.error is not None:
        return AgentResult(conversations=[], answer="", error=completion.error)
    return AgentResult(
        conversations=[conversation_from_completion(completion, kind=TURN)], answer=completion.text
    )
