"""Run many agents at once, batching their pending requests into one backend call per round.

Round r: every agent still running has exactly one pending request (its r-th); all of them go to the backend
in ONE `complete` call, and each completion is sent back to the agent that asked. An agent that returns leaves
the rounds; the others go on. For MemAgent this means all trajectories at chunk k are generated together, and
a trajectory with fewer chunks simply asks for its answer in an earlier round, inside the same batch as the
others' memory updates (per-request max_new_tokens).

Requests go to the backend in input order of the agents, so with a deterministic backend (greedy decoding) the
batched results equal running each agent alone, whatever the batch composition.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from memagent.records import ChatRequest, Completion
from memagent.rollout.agents import Agent
from memagent.rollout.llm import LLM

R = TypeVar("R")


def _advance(agent: Agent[R], completion: Completion | None) -> tuple[ChatRequest | None, R | None]:
    """Start (completion None) or resume an agent. Returns (its next request, None) or (None, its result)."""
    try:
        request = next(agent) if completion is None else agent.send(completion)
    except StopIteration as stop:
        return None, stop.value
    if not isinstance(request, ChatRequest):
        raise ValueError(f"an agent must yield ChatRequest objects, got {type(request).__name__}")
    return request, None


def run_agents(
    agents: Sequence[Agent[R]], llm: LLM, on_round: Callable[[int], None] | None = None
) -> list[R]:
    """Drive every agent to completion; return their results in input order.

    agents: freshly created generators (not yet started). llm: the backend; it is called once per round with
    the pending requests of all running agents, and must return one completion per request. on_round: called
    after each round with its number of completions (progress reporting).
    """
    results: list[R | None] = [None] * len(agents)
    pending: dict[int, ChatRequest] = {}
    for i, agent in enumerate(agents):
        request, results[i] = _advance(agent, None)
        if request is not None:
            pending[i] = request

    while pending:
        order = list(pending)  # ascending agent index: dicts keep insertion order
        completions = llm.complete([pending[i] for i in order])
        if len(completions) != len(order):
            raise ValueError(
                f"the LLM backend returned {len(completions)} completions for {len(order)} requests"
            )
        if on_round is not None:
            on_round(len(completions))
        pending = {}
        for i, completion in zip(order, completions):
            request, results[i] = _advance(agents[i], completion)
            if request is not None:
                pending[i] = request
    return results  # type: ignore[return-value]  # every slot was filled when its agent returned
