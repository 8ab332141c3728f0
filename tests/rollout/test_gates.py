"""Gated memory (docs/gates.md): the decision grammar, the gated prompt, and the workflow driven by a scripted LLM.

The scripted LLM answers each memory update with a chosen response and tokenizes it with the tiny tokenizer, so the
records carry real token ids: KEEP must leave the memory byte-identical, ANSWER must stop reading, and a response
that does not parse must act as MemAgent's update and be counted.
"""

from __future__ import annotations

import re

import pytest
import torch

from memagent.records import ANSWER, MEMORY, ChatRequest, Completion, Reward, Sample
from memagent.rollout import workflow
from memagent.rollout.chunking import num_chunks, tokenize_document
from memagent.rollout.gates import (
    ANSWER_NOW,
    GATES,
    KEEP,
    UNPARSED,
    UPDATE,
    decision_tokens,
    offered_words,
    read_decision,
    stop_words,
    update_line_tokens,
)
from memagent.rollout.prompts import (
    MEMORY_UPDATE_TEMPLATE,
    SECTION_FIRST_MEMORY_UPDATE_TEMPLATE,
    WorkflowConfig,
    render_memory_update,
)
from memagent.rollout.workflow import run_memagent
from memagent.training.gate_metrics import gate_metrics

DOCUMENT = "The capital of France is Paris. The key is under the blue stone. Document 12 has a library.\n" * 3
QUESTION = "Where is the key?"


def _config(gates: str, **overrides) -> WorkflowConfig:
    base = dict(chunk_tokens=16, memory_tokens=8, answer_tokens=6, max_chunks=None, question_tokens=64, gates=gates)
    return WorkflowConfig(**{**base, **overrides})


class ScriptedLLM:
    """Answers every memory update of round k (chunk k: all trajectories read one document) with script[k] (cycled),
    the answer with `answer`; records every request. Response ids are the tokenized text, log-probs a ramp."""

    def __init__(self, tokenizer, script: list[str], answer: str = "\\boxed{stone}") -> None:
        self.tokenizer, self.script, self.answer = tokenizer, script, answer
        self.requests: list[ChatRequest] = []
        self.rounds = 0

    def complete(self, requests: list[ChatRequest]) -> list[Completion]:
        out = []
        for request in requests:
            self.requests.append(request)
            is_update = "<section>" in request.messages[-1]["content"]
            text = self.script[self.rounds % len(self.script)] if is_update else self.answer
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            out.append(Completion(text=text, prompt_ids=[1, 2, 3], response_ids=ids,
                                  logprobs=-torch.arange(1, len(ids) + 1, dtype=torch.float32) / 10))
        self.rounds += 1
        return out


def _memory_shown(request: ChatRequest) -> str:
    return re.search(r"<memory>\n(.*)\n</memory>", request.messages[-1]["content"], re.DOTALL).group(1)


# ---------------------------------------------------------------- grammar


@pytest.mark.parametrize("gates, words", [("none", ()), ("update", (KEEP, UPDATE)), ("exit", (UPDATE, ANSWER_NOW)),
                                          ("both", (KEEP, UPDATE, ANSWER_NOW))])
def test_each_setting_offers_its_words_and_stops_after_keep_and_answer(gates, words) -> None:
    assert offered_words(gates) == words
    assert stop_words(gates) == tuple(w for w in words if w != UPDATE)


def test_an_unknown_setting_is_refused_naming_the_field() -> None:
    with pytest.raises(ValueError, match="workflow.gates='sometimes'"):
        WorkflowConfig(gates="sometimes")
    with pytest.raises(ValueError, match="gates='x'"):
        offered_words("x")


def test_keep_hands_back_the_old_memory_itself_and_update_the_lines_after_the_word() -> None:
    old = "  the key: blue stone\n(line two)  "
    keep = read_decision("KEEP", old, "both")
    assert keep.decision == KEEP and keep.memory is old and not keep.stops_reading
    update = read_decision("\n UPDATE \nnew memory\nline 2\n", old, "both")
    assert update.decision == UPDATE and update.memory == "new memory\nline 2" and not update.stops_reading
    answer = read_decision("ANSWER\n", old, "exit")
    assert answer.decision == ANSWER_NOW and answer.memory is old and answer.stops_reading
    assert read_decision("UPDATE", old, "update").memory == ""  # the word alone: an empty memory


@pytest.mark.parametrize("response, gates", [("The key is under the stone.", "both"), ("KEEP it", "both"),
                                             ("keep", "both"), ("ANSWER", "update"), ("KEEP", "exit"), ("", "both")])
def test_anything_else_is_unparsed_and_overwrites_the_memory_as_memagent_does(response, gates) -> None:
    gated = read_decision(response, "old", gates)
    assert gated.decision == UNPARSED and gated.memory == response.strip() and not gated.stops_reading


def test_decision_tokens_split_a_response_into_decision_and_memory(tiny_tokenizer) -> None:
    ids = tiny_tokenizer("UPDATE\nthe key", add_special_tokens=False)["input_ids"]
    n = decision_tokens(UPDATE, ids, tiny_tokenizer)
    assert "\n" in tiny_tokenizer.decode(ids[:n]) and "\n" not in tiny_tokenizer.decode(ids[: n - 1])
    assert decision_tokens(KEEP, [5, 6], tiny_tokenizer) == 2 and decision_tokens(UNPARSED, [5, 6], tiny_tokenizer) == 0
    assert update_line_tokens(tiny_tokenizer) == len(tiny_tokenizer("UPDATE\n", add_special_tokens=False)["input_ids"])


# ---------------------------------------------------------------- prompts


@pytest.mark.parametrize("section_first", [False, True])
def test_without_gates_the_prompt_is_memagents_byte_for_byte(section_first) -> None:
    template = SECTION_FIRST_MEMORY_UPDATE_TEMPLATE if section_first else MEMORY_UPDATE_TEMPLATE
    expected = template.format(problem="Q?", memory="m", chunk="c")
    assert render_memory_update("Q?", "m", "c", section_first=section_first) == expected
    assert render_memory_update("Q?", "m", "c", section_first=section_first, gates="none") == expected


@pytest.mark.parametrize("section_first", [False, True])
@pytest.mark.parametrize("gates", GATES[1:])
def test_a_gated_prompt_keeps_the_instruction_and_blocks_and_offers_only_its_words(gates, section_first) -> None:
    plain = render_memory_update("Q?", "m", "c", section_first=section_first)
    gated = render_memory_update("Q?", "m", "c", section_first=section_first, gates=gates)
    instruction, blocks = plain.split("<problem>\n")
    gated_head, gated_blocks = gated.split("<problem>\n")
    assert gated_head.startswith(instruction)
    assert gated_blocks == blocks.removesuffix("Updated memory:\n") + "Decision:\n"
    for word in (KEEP, UPDATE, ANSWER_NOW):
        assert (f"\n{word}: " in gated_head) == (word in offered_words(gates))


def test_the_decision_words_come_before_anything_a_question_changes() -> None:
    """Every gated prompt of a round opens with the same text up to the <problem> block, words included, so the
    engine prefills them once per round (memagent.rollout.prefill), not once per question."""
    a = render_memory_update("Name the city.", "No previous memory", "Paris is in France.", gates="both")
    b = render_memory_update("Whose code?", "The code is 12.", "Nothing here.", gates="both")
    shared = a[: next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)]
    assert shared.endswith("<problem>\n") and all(f"\n{word}: " in shared for word in (KEEP, UPDATE, ANSWER_NOW))


def test_a_problem_holding_a_block_tag_does_not_move_the_rules() -> None:
    gated = render_memory_update("Is <problem>\n a tag?", "m", "c", gates="both")
    assert gated.index("\nKEEP: ") < gated.index("Is <problem>")


# ---------------------------------------------------------------- the workflow


def test_without_gates_requests_and_records_are_memagents(tiny_tokenizer) -> None:
    llm = ScriptedLLM(tiny_tokenizer, ["KEEP"])
    [trajectory] = run_memagent([Sample(DOCUMENT, QUESTION, [])], llm, _config("none"))
    updates = [r for r in llm.requests if "<section>" in r.messages[-1]["content"]]
    assert all(r.stop_texts == () and r.max_new_tokens == 8 for r in updates)
    assert trajectory.memories == ["KEEP"] * len(updates)  # "KEEP" is just memory text to MemAgent
    assert trajectory.decisions == [""] * len(updates)
    assert trajectory.num_chunks == trajectory.document_chunks == len(updates)


def test_keep_leaves_the_memory_byte_identical_and_writes_no_memory_token(tiny_tokenizer) -> None:
    memory = "  key: under the blue stone  \n  second line"
    llm = ScriptedLLM(tiny_tokenizer, [f"UPDATE\n{memory}", "KEEP", "KEEP", "  KEEP  "])
    [trajectory] = run_memagent([Sample(DOCUMENT, QUESTION, [])], llm, _config("update"))
    k = trajectory.num_chunks
    assert k >= 4 and trajectory.decisions == [UPDATE, KEEP, KEEP, KEEP] * (k // 4) + [UPDATE, KEEP, KEEP][: k % 4]
    shown = [_memory_shown(r) for r in llm.requests if "<section>" in r.messages[-1]["content"]]
    assert shown[1:4] == [memory.strip()] * 3  # the kept memory, byte for byte, in the next prompts
    assert trajectory.memories[1:4] == [memory.strip()] * 3
    updates = [c for c in trajectory.conversations if c.kind == MEMORY]
    for conversation, decision in zip(updates, trajectory.decisions):
        assert (conversation.decision_tokens == len(conversation.response_ids)) == (decision == KEEP)
    update_line = update_line_tokens(tiny_tokenizer)
    assert all(r.stop_texts == (KEEP,) and r.max_new_tokens == 8 + update_line
               for r in llm.requests if "<section>" in r.messages[-1]["content"])
    # The records hold exactly what the backend returned: ids and log-probs of every token, KEEP's included.
    for conversation in updates:
        assert conversation.response_ids == tiny_tokenizer(
            llm.script[conversation.chunk_index % 4], add_special_tokens=False)["input_ids"]
        assert conversation.logprobs.shape == (len(conversation.response_ids),)
        assert conversation.response_mask == [1] * len(conversation.response_ids)


def test_answer_stops_reading_and_answers_from_the_memory_as_it_was(tiny_tokenizer) -> None:
    llm = ScriptedLLM(tiny_tokenizer, ["UPDATE\nkey under stone", "ANSWER"])
    config = _config("both")
    [trajectory] = run_memagent([Sample(DOCUMENT, QUESTION, ["stone"])], llm, config)
    whole = num_chunks(len(tokenize_document(DOCUMENT, tiny_tokenizer)), config.chunk_tokens)
    assert whole >= 4
    assert [c.kind for c in trajectory.conversations] == [MEMORY, MEMORY, ANSWER]
    assert trajectory.decisions == [UPDATE, ANSWER_NOW]
    assert (trajectory.num_chunks, trajectory.document_chunks) == (2, whole)
    assert _memory_shown(llm.requests[-1]) == "key under stone" and trajectory.answer == "\\boxed{stone}"
    assert len(llm.requests) == 3  # two updates and the answer: the other chunks were never sent


class RecordingBar:
    """The progress bar's two calls, recorded: what the rollout promised and what it reported done."""

    def __init__(self, total: int) -> None:
        self.total, self.done, self.closed = total, 0, False

    def update(self, n: int = 1) -> None:
        self.done += n

    def close(self) -> None:
        self.closed = True


@pytest.mark.parametrize("script", [["UPDATE\nkey under stone", "ANSWER"], ["UPDATE\nkey"], ["ANSWER"]])
def test_the_progress_bar_ends_at_its_total_whether_or_not_trajectories_exit_early(
    tiny_tokenizer, monkeypatch, script
) -> None:
    bars: list[RecordingBar] = []

    def recording_bar(total: int, desc: str, *, enabled: bool) -> RecordingBar:
        bars.append(RecordingBar(total))
        return bars[-1]

    monkeypatch.setattr(workflow, "progress_bar", recording_bar)
    samples = [Sample(DOCUMENT, QUESTION, ["stone"]), Sample(DOCUMENT * 2, QUESTION, ["stone"])]
    trajectories = run_memagent(samples, ScriptedLLM(tiny_tokenizer, script), _config("both"), group_size=3)
    [bar] = bars
    assert bar.total == sum(t.document_chunks + 1 for t in trajectories)
    assert (bar.done, bar.closed) == (bar.total, True)


def test_garbage_counts_as_update_and_is_counted_apart(tiny_tokenizer) -> None:
    llm = ScriptedLLM(tiny_tokenizer, ["the key is under the stone", "KEEP", "ANSWER"])
    trajectories = run_memagent([Sample(DOCUMENT, QUESTION, ["stone"])], llm, _config("both"), group_size=2)
    for t in trajectories:
        assert t.decisions[0] == UNPARSED and t.memories[0] == "the key is under the stone"
        first = t.conversations[0]
        assert first.decision_tokens == 0 and t.memory_tokens_generated == len(first.response_ids)
        t.reward = Reward(correct=1.0)
    metrics = gate_metrics(trajectories, all_reduce_sum=lambda x: x)
    decisions = [d for t in trajectories for d in t.decisions]
    assert metrics["gates/unparsed"] == decisions.count(UNPARSED) / len(decisions)
    assert metrics["gates/update_share"] == metrics["gates/unparsed"]  # unparsed acts as UPDATE
    assert metrics["gates/keep_share"] + metrics["gates/update_share"] + metrics["gates/answer_share"] == pytest.approx(1.0)
    assert metrics["rollout/chunks_read"] == 3.0
    generated = sum(t.generated_tokens for t in trajectories)
    assert metrics["rollout/generated_tokens_per_correct"] == generated / 2


def test_without_gates_the_metrics_leave_the_gate_keys_out(tiny_tokenizer) -> None:
    [trajectory] = run_memagent([Sample(DOCUMENT, QUESTION, [])], ScriptedLLM(tiny_tokenizer, ["m"]), _config("none"))
    trajectory.reward = Reward(correct=0.0)
    metrics = gate_metrics([trajectory], all_reduce_sum=lambda x: x)
    assert not any(key.startswith("gates/") for key in metrics) and "rollout/generated_tokens_per_correct" not in metrics
    assert metrics["rollout/chunks_read_share"] == 1.0
    assert metrics["rollout/memory_tokens_per_question"] == trajectory.memory_tokens_generated
