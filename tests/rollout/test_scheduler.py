"""The scheduler: one batched backend call per round, results routed back in input order."""

from __future__ import annotations

import pytest
import torch

from memagent.records import ChatRequest, Completion
from memagent.rollout.agents import AgentResult, single_turn_agent
from memagent.rollout.llm import LocalLLM
from memagent.rollout.prompts import WorkflowConfig
from memagent.rollout.sampling import SamplingParams
from memagent.rollout.scheduler import run_agents
from memagent.rollout.tool_agent import calculator_agent
from memagent.rollout.workflow import memagent_agent

GREEDY = SamplingParams(temperature=0.0)
CONFIG = WorkflowConfig(chunk_tokens=24, memory_tokens=6, answer_tokens=5, max_chunks=None, question_tokens=32)
DOCS = [
    "",
    "A short document about the river.",
    "The capital of France is Paris. The capital of Japan is Tokyo. " * 2,
]


class CountingLLM:
    """Wraps a backend and records the size of every batched call."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.tokenizer = inner.tokenizer
        self.batch_sizes: list[int] = []

    def complete(self, requests: list[ChatRequest]) -> list[Completion]:
        self.batch_sizes.append(len(requests))
        return self.inner.complete(requests)


def _mixed_agents(tokenizer) -> list:
    agents = [
        memagent_agent(f"Question {i}: what is the capital?", doc, tokenizer, CONFIG)
        for i, doc in enumerate(DOCS)
    ]
    agents.append(single_turn_agent("Say hello.", max_new_tokens=3))
    agents.append(calculator_agent("What is 6 * 7?", tokenizer, max_new_tokens=4, max_turns=2))
    return agents


def test_batched_results_equal_running_each_agent_alone(tiny_model, tiny_tokenizer) -> None:
    llm = LocalLLM(tiny_model, tiny_tokenizer, params=GREEDY)
    batched = run_agents(_mixed_agents(tiny_tokenizer), llm)
    alone = [run_agents([agent], llm)[0] for agent in _mixed_agents(tiny_tokenizer)]
    assert len(batched) == len(alone) == len(DOCS) + 2
    for together, single in zip(batched, alone):
        assert together.answer == single.answer
        assert len(together.conversations) == len(single.conversations)
        for a, b in zip(together.conversations, single.conversations):
            assert (a.prompt_ids, a.response_ids, a.response_mask, a.text) == (
                b.prompt_ids,
                b.response_ids,
                b.response_mask,
                b.text,
            )
            assert (a.kind, a.chunk_index, a.finished) == (b.kind, b.chunk_index, b.finished)
            torch.testing.assert_close(a.logprobs, b.logprobs, atol=1e-4, rtol=0)


def test_one_backend_call_per_round_with_every_pending_request(tiny_model, tiny_tokenizer) -> None:
    llm = CountingLLM(LocalLLM(tiny_model, tiny_tokenizer, params=GREEDY))
    agents = [memagent_agent("q?", doc, tiny_tokenizer, CONFIG) for doc in DOCS]
    results = run_agents(agents, llm)
    chunks = [len(r.conversations) - 1 for r in results]
    assert chunks[0] == 0 and chunks[1] == 1 and chunks[2] > 1
    # Round r holds every agent that has not returned yet: agent i asks in rounds 0..chunks[i].
    assert llm.batch_sizes == [sum(c >= r for c in chunks) for r in range(max(chunks) + 1)]


def test_results_come_back_in_input_order() -> None:
    class EchoLLM:
        tokenizer = None

        def complete(self, requests: list[ChatRequest]) -> list[Completion]:
            return [Completion(text=r.messages[0]["content"]) for r in requests]

    def asks(n: int, tag: str):
        answer = ""
        for turn in range(n):
            completion = yield ChatRequest(
                messages=({"role": "user", "content": f"{tag}{turn}"},), max_new_tokens=1
            )
            answer = completion.text
        return AgentResult(conversations=[], answer=answer)

    rounds: list[int] = []
    results = run_agents([asks(3, "a"), asks(0, "b"), asks(1, "c"), asks(2, "d")], EchoLLM(), on_round=rounds.append)
    assert [r.answer for r in results] == ["a2", "", "c0", "d1"]
    assert rounds == [3, 2, 1]  # the progress callback sees each round's completions, 6 requests in all


def test_backend_returning_the_wrong_number_of_completions_is_refused() -> None:
    class ShortLLM:
        tokenizer = None

        def complete(self, requests: list[ChatRequest]) -> list[Completion]:
            return []

    with pytest.raises(ValueError, match="0 completions for 2 requests"):
        run_agents(
            [single_turn_agent("a", max_new_tokens=1), single_turn_agent("b", max_new_tokens=1)], ShortLLM()
        )


def test_an_agent_yielding_something_else_is_refused() -> None:
    def bad_agent():
        yield "not a request"

    class NeverCalledLLM:
        tokenizer = None

        def complete(self, requests: list[ChatRequest]) -> list[Completion]:
            raise AssertionError("the scheduler must refuse the agent before calling the backend")

    with pytest.raises(ValueError, match="ChatRequest"):
        run_agents([bad_agent()], NeverCalledLLM())


def test_capping_generate_rows_gives_the_same_greedy_results(tiny_model, tiny_tokenizer) -> None:
    whole = run_agents(_mixed_agents(tiny_tokenizer), LocalLLM(tiny_model, tiny_tokenizer, params=GREEDY))
    capped = run_agents(
        _mixed_agents(tiny_tokenizer), LocalLLM(tiny_model, tiny_tokenizer, params=GREEDY, max_batch_rows=2)
    )
    for a, b in zip(whole, capped):
        assert a.answer == b.answer
        assert [c.response_ids for c in a.conversations] == [c.response_ids for c in b.conversations]


def test_max_batch_rows_below_one_is_refused(tiny_model, tiny_tokenizer) -> None:
    with pytest.raises(ValueError, match="max_batch_rows"):
        LocalLLM(tiny_model, tiny_tokenizer, max_batch_rows=0)


def test_an_in_flight_cap_gives_the_same_greedy_results_as_all_at_once(tiny_model, tiny_tokenizer) -> None:
    llm = LocalLLM(tiny_model, tiny_tokenizer, params=GREEDY)
    whole = run_agents(_mixed_agents(tiny_tokenizer), llm)
    for cap in (1, 2, 4):
        capped = run_agents(_mixed_agents(tiny_tokenizer), llm, max_running=cap)
        for a, b in zip(whole, capped, strict=True):
            assert a.answer == b.answer
            assert [c.response_ids for c in a.conversations] == [c.response_ids for c in b.conversations]


def test_a_finished_agent_hands_its_slot_to_the_next_in_the_following_round() -> None:
    """Agents of 3, 1, 1, 2 requests under a cap of 2: round by round the running set is {0, 1}, {0, 2}, {0, 3},
    {3}; with fixed batches of 2 it would take 3 + 2 = 5 rounds, here 4."""
    batches: list[list[str]] = []

    class EchoLLM:
        tokenizer = None

        def complete(self, requests: list[ChatRequest]) -> list[Completion]:
            batches.append([r.messages[0]["content"] for r in requests])
            return [Completion(text=r.messages[0]["content"]) for r in requests]

    def asks(n: int, tag: str):
        for turn in range(n):
            yield ChatRequest(messages=({"role": "user", "content": f"{tag}{turn}"},), max_new_tokens=1)
        return AgentResult(conversations=[], answer=tag)

    finished: list[tuple[int, str]] = []
    results = run_agents((asks(n, tag) for n, tag in ((3, "a"), (1, "b"), (1, "c"), (2, "d"))), EchoLLM(),
                         max_running=2, on_result=lambda i, r: finished.append((i, r.answer)))
    assert batches == [["a0", "b0"], ["a1", "c0"], ["a2", "d0"], ["d1"]]
    assert [r.answer for r in results] == ["a", "b", "c", "d"]  # input order
    assert finished == [(1, "b"), (2, "c"), (0, "a"), (3, "d")]  # finishing order


def test_agents_asking_nothing_finish_without_taking_a_slot() -> None:
    class EchoLLM:
        tokenizer = None
        calls = 0

        def complete(self, requests: list[ChatRequest]) -> list[Completion]:
            EchoLLM.calls += 1
            assert len(requests) <= 1
            return [Completion(text="x") for _ in requests]

    def asks(n: int, tag: str):
        for _ in range(n):
            yield ChatRequest(messages=({"role": "user", "content": tag},), max_new_tokens=1)
        return AgentResult(conversations=[], answer=tag)

    results = run_agents([asks(0, "a"), asks(2, "b"), asks(0, "c"), asks(0, "d"), asks(1, "e")], EchoLLM(),
                         max_running=1)
    assert [r.answer for r in results] == ["a", "b", "c", "d", "e"]
    assert EchoLLM.calls == 3


def test_an_in_flight_cap_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="max_running"):
        run_agents([single_turn_agent("a", max_new_tokens=1)], None, max_running=0)
