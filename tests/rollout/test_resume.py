"""A MemAgent rollout resumed from its first memory updates (a stopped evaluation, memagent.evaluation.inflight)
goes on exactly as the uninterrupted rollout: the memory is the whole state carried from one chunk to the next."""

from __future__ import annotations

import pytest
import torch

from memagent.records import MEMORY, ChatRequest, Completion, Conversation, Sample
from memagent.rollout import workflow
from memagent.rollout.gates import ANSWER_NOW, KEEP, UPDATE
from memagent.rollout.llm import LocalLLM
from memagent.rollout.prompts import WorkflowConfig
from memagent.rollout.sampling import SamplingParams
from memagent.rollout.workflow import run_memagent

DOCUMENT = "The capital of France is Paris. The key is under the blue stone. Document 12 has a library.\n" * 3
QUESTION = "Where is the key?"


def _config(**overrides) -> WorkflowConfig:
    base = dict(chunk_tokens=24, memory_tokens=8, answer_tokens=6, max_chunks=None, question_tokens=64)
    return WorkflowConfig(**{**base, **overrides})


class RecordingLLM:
    """A backend that records every request and passes it on to `inner`."""

    def __init__(self, inner) -> None:
        self.inner, self.tokenizer, self.requests = inner, inner.tokenizer, []

    def complete(self, requests: list[ChatRequest]) -> list[Completion]:
        self.requests.extend(requests)
        return self.inner.complete(requests)


class ScriptedLLM:
    """Memory update k (of the one document) gets script[k]; the answer gets "\\boxed{stone}"."""

    def __init__(self, tokenizer, script: list[str]) -> None:
        self.tokenizer, self.script, self.requests = tokenizer, script, []

    def complete(self, requests: list[ChatRequest]) -> list[Completion]:
        out = []
        for request in requests:
            is_update = "<section>" in request.messages[-1]["content"]
            text = self.script[sum("<section>" in r.messages[-1]["content"] for r in self.requests)] if is_update \
                else "\\boxed{stone}"
            self.requests.append(request)
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            out.append(Completion(text=text, prompt_ids=[1], response_ids=ids, logprobs=torch.zeros(len(ids))))
        return out


@pytest.fixture
def greedy(tiny_model, tiny_tokenizer) -> LocalLLM:
    return LocalLLM(tiny_model, tiny_tokenizer, params=SamplingParams(temperature=0.0))


def test_a_rollout_resumed_after_any_update_asks_and_answers_as_the_uninterrupted_one(greedy) -> None:
    config, sample = _config(), Sample(DOCUMENT, QUESTION, ["stone"])
    whole = RecordingLLM(greedy)
    [full] = run_memagent([sample], whole, config)
    assert full.num_chunks >= 3
    for j in range(1, full.num_chunks + 1):
        resumed = RecordingLLM(greedy)
        [trajectory] = run_memagent([sample], resumed, config, resume_from={0: full.conversations[:j]})
        assert [r.messages for r in resumed.requests] == [r.messages for r in whole.requests[j:]]
        assert trajectory.memories == full.memories and trajectory.answer == full.answer
        assert trajectory.conversations[:j] == full.conversations[:j]  # the resumed updates open the record
        assert (trajectory.num_chunks, trajectory.generated_tokens) == (full.num_chunks, full.generated_tokens)


def test_only_new_updates_are_handed_on_each_with_its_trajectory(greedy) -> None:
    config, samples = _config(), [Sample(DOCUMENT, QUESTION, []), Sample(DOCUMENT[:200], QUESTION, [])]
    full = run_memagent(samples, greedy, config)
    seen: list[tuple[int, int]] = []
    run_memagent(samples, greedy, config, resume_from={1: full[1].conversations[:1]},
                 on_update=lambda i, update: seen.append((i, update.chunk_index)))
    assert sorted(seen) == [(0, k) for k in range(full[0].num_chunks)] + [(1, k)
                                                                         for k in range(1, full[1].num_chunks)]


def test_a_gated_rollout_resumed_after_its_exit_asks_only_for_the_answer(tiny_tokenizer) -> None:
    config = _config(chunk_tokens=16, gates="both")
    sample = Sample(DOCUMENT, QUESTION, ["stone"])
    [full] = run_memagent([sample], ScriptedLLM(tiny_tokenizer, ["KEEP", "UPDATE\nkey under stone", "ANSWER"]),
                          config)
    assert full.decisions == [KEEP, UPDATE, ANSWER_NOW] and full.num_chunks < full.document_chunks
    llm = ScriptedLLM(tiny_tokenizer, [])
    [trajectory] = run_memagent([sample], llm, config, resume_from={0: full.conversations[:3]})
    assert len(llm.requests) == 1 and "<section>" not in llm.requests[0].messages[-1]["content"]
    assert "key under stone" in llm.requests[0].messages[-1]["content"]
    assert trajectory.decisions == full.decisions and trajectory.answer == "\\boxed{stone}"


def test_the_progress_bar_counts_only_what_the_resumed_run_does(greedy, monkeypatch) -> None:
    totals: list[tuple[int, list[int]]] = []

    class Bar:
        def __init__(self, total: int, desc: str, *, enabled: bool) -> None:
            self.steps: list[int] = []
            totals.append((total, self.steps))

        def update(self, n: int = 1) -> None:
            self.steps.append(n)

        def close(self) -> None:
            pass

    config, sample = _config(), Sample(DOCUMENT, QUESTION, [])
    [full] = run_memagent([sample], greedy, config)
    monkeypatch.setattr(workflow, "progress_bar", Bar)
    run_memagent([sample], greedy, config, resume_from={0: full.conversations[:2]})
    [(total, steps)] = totals
    assert total == full.num_chunks + 1 - 2 == sum(steps)


def test_resume_from_must_be_the_first_updates_in_order(greedy) -> None:
    config, sample = _config(), Sample(DOCUMENT, QUESTION, [])
    [full] = run_memagent([sample], greedy, config)
    update: Conversation = full.conversations[1]
    assert update.kind == MEMORY and update.chunk_index == 1
    with pytest.raises(ValueError, match="resume_from"):
        run_memagent([sample], greedy, config, resume_from={0: [update]})
    with pytest.raises(ValueError, match="resume_from"):
        run_memagent([sample], greedy, config, resume_from={0: full.conversations[:1] + [full.conversations[-1]]})
