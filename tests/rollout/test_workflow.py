"""The MemAgent workflow on the tiny model: chunks, memory budget, truncation, grouping, token records."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from memagent.records import ANSWER, MEMORY, ChatRequest, Completion, Sample
from memagent.rollout.chunking import tokenize_document
from memagent.rollout.llm import LocalLLM
from memagent.rollout.prompts import WorkflowConfig, render_final_answer, render_memory_update, user_message
from memagent.rollout.sampling import SamplingParams
from memagent.rollout.workflow import prepare_document, run_memagent

GREEDY = SamplingParams(temperature=0.0)
DOCUMENT = "The capital of France is Paris. The key is under the blue stone. Document 12 has a library.\n" * 3
QUESTION = "Where is the key?"


def _config(**overrides) -> WorkflowConfig:
    base = dict(chunk_tokens=32, memory_tokens=8, answer_tokens=6, max_chunks=None, question_tokens=64)
    return WorkflowConfig(**{**base, **overrides})


def _greedy(model, tokenizer) -> LocalLLM:
    return LocalLLM(model, tokenizer, params=GREEDY)


def _sections(tokenizer, conversations) -> list[str]:
    """The text inside <section> of each memory update's prompt, from its prompt ids."""
    return [
        re.search(r"<section>\n(.*)\n</section>", tokenizer.decode(c.prompt_ids), re.DOTALL).group(1)
        for c in conversations
        if c.kind == MEMORY
    ]


def test_trajectory_has_one_memory_update_per_chunk_in_order_then_the_answer(
    tiny_model, tiny_tokenizer
) -> None:
    config = _config()
    [trajectory] = run_memagent(
        [Sample(DOCUMENT, QUESTION, ["stone"])], _greedy(tiny_model, tiny_tokenizer), config
    )
    n_chunks = -(-len(tokenize_document(DOCUMENT, tiny_tokenizer)) // config.chunk_tokens)
    assert n_chunks >= 3 and trajectory.num_chunks == n_chunks
    assert [c.kind for c in trajectory.conversations] == [MEMORY] * n_chunks + [ANSWER]
    assert [c.chunk_index for c in trajectory.conversations] == [*range(n_chunks), -1]
    assert trajectory.answer == trajectory.conversations[-1].text


def test_memory_never_exceeds_its_budget(tiny_model, tiny_tokenizer) -> None:
    config = _config(memory_tokens=5)
    llm = _greedy(tiny_model, tiny_tokenizer)
    [trajectory] = run_memagent([Sample(DOCUMENT, QUESTION, [])], llm, config)
    for conversation in trajectory.conversations[:-1]:
        assert len(conversation.response_ids) <= config.memory_tokens
        # A finished update ended on a stop token; an unfinished one was cut at exactly the budget.
        ended = conversation.response_ids[-1] in llm.eos_token_ids
        assert conversation.finished == ended
        assert ended or len(conversation.response_ids) == config.memory_tokens
    assert trajectory.memory_truncated == [not c.finished for c in trajectory.conversations[:-1]]
    assert len(trajectory.conversations[-1].response_ids) <= config.answer_tokens


def test_each_update_overwrites_the_memory_the_next_prompt_shows(tiny_model, tiny_tokenizer) -> None:
    config = _config()
    [trajectory] = run_memagent([Sample(DOCUMENT, QUESTION, [])], _greedy(tiny_model, tiny_tokenizer), config)
    memories = [config.initial_memory, *trajectory.memories]
    assert trajectory.memories == [c.text.strip() for c in trajectory.conversations[:-1]]
    for k, conversation in enumerate(trajectory.conversations):
        memory = re.search(
            r"<memory>\n(.*)\n</memory>", tiny_tokenizer.decode(conversation.prompt_ids), re.DOTALL
        )
        assert memory.group(1) == memories[k]


def test_conversation_prompt_ids_decode_to_the_rendered_prompt(tiny_model, tiny_tokenizer) -> None:
    config = _config()
    [trajectory] = run_memagent([Sample(DOCUMENT, QUESTION, [])], _greedy(tiny_model, tiny_tokenizer), config)
    ids = tokenize_document(DOCUMENT, tiny_tokenizer)
    memories = [config.initial_memory, *trajectory.memories]
    for k, conversation in enumerate(trajectory.conversations[:-1]):
        chunk = tiny_tokenizer.decode(ids[k * 32 : (k + 1) * 32].tolist())
        content = render_memory_update(QUESTION, memories[k], chunk)
        expected = tiny_tokenizer.apply_chat_template(
            list(user_message(content)), tokenize=False, add_generation_prompt=True
        )
        assert tiny_tokenizer.decode(conversation.prompt_ids) == expected
    final = tiny_tokenizer.decode(trajectory.conversations[-1].prompt_ids)
    assert render_final_answer(QUESTION, memories[-1]) in final and final.endswith("<|im_start|>assistant\n")


def test_behaviour_logprobs_cover_every_sampled_token(tiny_model, tiny_tokenizer) -> None:
    [trajectory] = run_memagent(
        [Sample(DOCUMENT, QUESTION, [])], _greedy(tiny_model, tiny_tokenizer), _config()
    )
    for conversation in trajectory.conversations:
        assert conversation.logprobs.shape == (len(conversation.response_ids),)
        assert conversation.logprobs.dtype == torch.float32
        assert conversation.response_mask == [1] * len(conversation.response_ids)


def test_center_truncation_keeps_first_and_last_halves_and_caps_the_chunks(
    tiny_model, tiny_tokenizer
) -> None:
    config = _config(chunk_tokens=16, max_chunks=2)
    ids = tokenize_document(DOCUMENT, tiny_tokenizer)
    assert len(ids) > 4 * 16  # well over the 2 * 16-token cap
    assert prepare_document(DOCUMENT, tiny_tokenizer, config).tolist() == [
        *ids[:16].tolist(),
        *ids[-16:].tolist(),
    ]
    [trajectory] = run_memagent([Sample(DOCUMENT, QUESTION, [])], _greedy(tiny_model, tiny_tokenizer), config)
    assert trajectory.num_chunks == 2
    assert trajectory.document_tokens == len(ids)  # the whole document's length, not the truncated one
    assert _sections(tiny_tokenizer, trajectory.conversations) == [
        tiny_tokenizer.decode(ids[:16].tolist()),
        tiny_tokenizer.decode(ids[-16:].tolist()),
    ]


def test_no_truncation_when_max_chunks_is_none(tiny_model, tiny_tokenizer) -> None:
    config = _config(chunk_tokens=16, max_chunks=None)
    ids = tokenize_document(DOCUMENT, tiny_tokenizer)
    assert prepare_document(ids, tiny_tokenizer, config) is ids
    [trajectory] = run_memagent([Sample(DOCUMENT, QUESTION, [])], _greedy(tiny_model, tiny_tokenizer), config)
    assert trajectory.num_chunks == -(-len(ids) // 16)
    assert "".join(_sections(tiny_tokenizer, trajectory.conversations)) == DOCUMENT


def test_empty_document_answers_from_the_initial_memory(tiny_model, tiny_tokenizer) -> None:
    config = _config()
    [trajectory] = run_memagent([Sample("", QUESTION, [])], _greedy(tiny_model, tiny_tokenizer), config)
    [answer] = trajectory.conversations
    assert answer.kind == ANSWER and trajectory.num_chunks == 0
    assert render_final_answer(QUESTION, config.initial_memory) in tiny_tokenizer.decode(answer.prompt_ids)


def test_document_shorter_than_one_chunk_is_read_in_one_update(tiny_model, tiny_tokenizer) -> None:
    [trajectory] = run_memagent(
        [Sample("A short note.", QUESTION, [])], _greedy(tiny_model, tiny_tokenizer), _config()
    )
    assert [c.kind for c in trajectory.conversations] == [MEMORY, ANSWER]
    assert _sections(tiny_tokenizer, trajectory.conversations) == ["A short note."]


def test_question_longer_than_its_budget_keeps_its_end_in_every_prompt(tiny_model, tiny_tokenizer) -> None:
    question = "Read every document with care. " * 10 + "Where is the key?"
    config = _config(question_tokens=8)
    [trajectory] = run_memagent([Sample(DOCUMENT, question, [])], _greedy(tiny_model, tiny_tokenizer), config)
    ids = tiny_tokenizer(question, add_special_tokens=False)["input_ids"]
    kept = tiny_tokenizer.decode(ids[-8:])
    for conversation in trajectory.conversations:
        problem = re.search(
            r"<problem>\n(.*)\n</problem>", tiny_tokenizer.decode(conversation.prompt_ids), re.DOTALL
        )
        assert problem.group(1) == kept
    assert kept.endswith("Where is the key?")


def test_group_size_gives_contiguous_groups_per_question(tiny_model, tiny_tokenizer) -> None:
    samples = [Sample(DOCUMENT, QUESTION, []), Sample("", "Who?", []), Sample("A short note.", "What?", [])]
    generator = torch.Generator().manual_seed(0)
    llm = LocalLLM(tiny_model, tiny_tokenizer, params=SamplingParams(), generator=generator)
    trajectories = run_memagent(samples, llm, _config(), group_size=3)
    assert [t.sample_index for t in trajectories] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert [t.num_chunks for t in trajectories[3:]] == [0, 0, 0, 1, 1, 1]
    # Sampled (not greedy), so the rollouts of one question differ.
    assert len({tuple(t.conversations[0].response_ids) for t in trajectories[:3]}) > 1


def test_without_prompt_ids_the_records_keep_only_responses(tiny_model, tiny_tokenizer) -> None:
    llm = _greedy(tiny_model, tiny_tokenizer)
    [kept] = run_memagent([Sample(DOCUMENT, QUESTION, [])], llm, _config())
    [dropped] = run_memagent([Sample(DOCUMENT, QUESTION, [])], llm, _config(), keep_prompt_ids=False)
    assert all(c.prompt_ids == [] for c in dropped.conversations)
    assert [c.response_ids for c in dropped.conversations] == [c.response_ids for c in kept.conversations]
    assert dropped.answer == kept.answer


def test_a_failed_backend_call_marks_the_trajectory_failed(tiny_tokenizer) -> None:
    class FailingLLM:
        tokenizer = tiny_tokenizer

        def complete(self, requests: list[ChatRequest]) -> list[Completion]:
            return [Completion(text="", error="timeout") for _ in requests]

    [trajectory] = run_memagent([Sample(DOCUMENT, QUESTION, ["stone"])], FailingLLM(), _config())
    assert (
        trajectory.error == "timeout" and trajectory.answer == "" and trajectory.conversations == []
    )


def test_token_ids_as_document_are_used_without_a_copy(tiny_tokenizer) -> None:
    ids = np.arange(3, 40, dtype=np.int32)
    assert prepare_document(ids, tiny_tokenizer, _config(max_chunks=8)) is ids


def test_run_memagent_refuses_a_group_size_below_one(tiny_model, tiny_tokenizer) -> None:
    with pytest.raises(ValueError, match="group_size"):
        run_memagent([], _greedy(tiny_model, tiny_tokenizer), _config(), group_size=0)


def test_run_memagent_needs_the_backends_tokenizer() -> None:
    class NoTokenizerLLM:
        tokenizer = None

        def complete(self, requests: list[ChatRequest]) -> list[Completion]:
            return []

    with pytest.raises(ValueError, match="tokenizer"):
        run_memagent([Sample("doc", "q", [])], NoTokenizerLLM(), _config())


class _RecordingBar:
    """A progress bar that remembers its total and how far it got."""

    def __init__(self, total: int | None, desc: str, *, enabled: bool = True) -> None:
        self.total, self.done, self.closed = total, 0, False

    def update(self, n: int = 1) -> None:
        self.done += n

    def close(self) -> None:
        self.closed = True


def test_progress_bar_counts_every_conversation_of_truncated_and_grouped_rollouts(
    tiny_model, tiny_tokenizer, monkeypatch
) -> None:
    import memagent.rollout.workflow as workflow

    bars: list[_RecordingBar] = []
    monkeypatch.setattr(workflow, "progress_bar", lambda *a, **k: bars.append(_RecordingBar(*a, **k)) or bars[-1])
    samples = [Sample(DOCUMENT, QUESTION, []), Sample("short", QUESTION, [])]
    config = _config(chunk_tokens=16, max_chunks=3)  # the long document is capped at 3 chunks, the short has 1
    trajectories = run_memagent(samples, _greedy(tiny_model, tiny_tokenizer), config, group_size=2,
                                show_progress=True)
    [bar] = bars
    produced = sum(len(t.conversations) for t in trajectories)
    assert produced == 2 * (3 + 1) + 2 * (1 + 1)
    assert bar.total == bar.done == produced and bar.closed


def test_section_first_workflow_shows_each_chunk_before_the_memory_it_updates(tiny_model, tiny_tokenizer) -> None:
    config = _config(section_first=True)
    [trajectory] = run_memagent([Sample(DOCUMENT, QUESTION, [])], _greedy(tiny_model, tiny_tokenizer), config)
    ids = tokenize_document(DOCUMENT, tiny_tokenizer)
    memories = [config.initial_memory, *trajectory.memories]
    for k, conversation in enumerate(trajectory.conversations[:-1]):
        chunk = tiny_tokenizer.decode(ids[k * 32 : (k + 1) * 32].tolist())
        content = render_memory_update(QUESTION, memories[k], chunk, section_first=True)
        text = tiny_tokenizer.decode(conversation.prompt_ids)
        assert content in text and text.index("<section>") < text.index("<memory>")
