"""Run many agents at once, batching their pending requests into one backend call per round.

Round r: every agent still running has exactly one pending request; all of them go to the backend in ONE
`complete` call, and each completion is sent back to the agent that asked. An agent that returns leaves the rounds;
the others go on. For MemAgent with every agent started at once (the default) this means all trajectories at chunk k
are generated together, and a trajectory with fewer chunks simply asks for its answer in an earlier round, inside
the same batch as the others' memory updates (per-request max_new_tokens).

In-flight cap (`max_running`). With a cap, at most that many agents run at once and the rest wait in input order;
when an agent returns, the next waiting one starts, and its first request joins the very next round. This is
continuous batching at the granularity of rounds: an agent that is done early (a short document, an exit gate's
ANSWER, docs/gates.md) hands its slot to a new question instead of leaving the batch to shrink until its slowest
member is done. `agents` may then be a lazy iterable: an agent is created only when it starts.

Requests go to the backend in input order of the agents, so with a deterministic backend (greedy decoding) the
batched results equal running each agent alone, whatever the batch composition or the cap.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
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
    agents: Iterable[Agent[R]],
    llm: LLM,
    on_round: Callable[[int], None] | None = None,
    *,
    max_running: int | None = None,
    on_result: Callable[[int, R], None] | None = None,
) -> list[R]:
    """Drive every agent to completion; return their results in input order.

    agents: freshly created generators (not yet started), or an iterable making them. llm: the backend; it is called
    once per round with the pending requests of all running agents, and must return one completion per request.
    on_round: called after each round with its number of completions (progress reporting). max_running: at most
    this many agents in flight (None: all at once); a finished agent's slot goes to the next one in input order.
    on_result: called with (input index, result) as each agent returns, in the order they finish (a caller writes
    finished work as it comes, so a stop loses only the agents in flight).
    """
    if max_running is not None and max_running < 1:
        raise ValueError(f"run_agents: max_running must be >= 1 or None, got {max_running}")
    waiting = enumerate(agents)
    started: list[Agent[R]] = []
    results: list[R | None] = []
    pending: dict[int, ChatRequest] = {}

    def finish(i: int, result: R) -> None:
        results[i] = result
        if on_result is not None:
            on_result(i, result)

    def start_waiting() -> None:
        """Start agents in input order until the cap is reached or none is left; one that returns at once (it asked
        for nothing) finishes without taking a slot."""
        while max_running is None or len(pending) < max_running:
            try:
                i, agent = next(waiting)
            except StopIteration:
                return
            started.append(agent)
            results.append(None)
            request, result = _advance(agent, None)
            if request is None:
                finish(i, result)
            else:
                pending[i] = request

    start_waiting()
    while pending:
        order = list(pending)  # ascending agent index: agents start in input order and dicts keep insertion order
        completions = llm.complete([pending[i] for i in order])
        if len(completions) != len(order):
            raise ValueError(
                f"the LLM backend returned {len(completions)} completions for {len(order)} requests"
            )
        if on_round is not None:
            on_round(len(completions))
        pending = {}
        for i, completion in zip(order, completions):
            request, result = _advance(started[i], completion)
            if request is None:
                finish(i, result)
            else:
                pending[i] = request
        start_waiting()
    return results  # type: ignore[return-value]  # every slot was filled when its agent returned
