"""MemAgent's prompts: block structure, chat-template rendering, and the question budget."""

from __future__ import annotations

import pytest

from memagent.rollout.prompts import (
    WorkflowConfig,
    fit_question,
    render_final_answer,
    render_memory_update,
    user_message,
)


def _blocks_in_order(text: str, markers: list[str]) -> bool:
    positions = [text.find(m) for m in markers]
    return all(p >= 0 for p in positions) and positions == sorted(positions)


def test_memory_prompt_has_problem_memory_section_blocks_and_ends_with_updated_memory() -> None:
    text = render_memory_update("Who wrote it?", "No previous memory", "The captain wrote it.")
    markers = ["<problem>", "Who wrote it?", "</problem>", "<memory>", "No previous memory", "</memory>"]
    assert _blocks_in_order(text, [*markers, "<section>", "The captain wrote it.", "</section>"])
    assert text.rstrip("\n").endswith("Updated memory:")
    # An instruction paragraph comes before the blocks.
    assert text.index("<problem>") > 100


def test_final_prompt_asks_for_boxed_answer_from_memory_and_ends_with_your_answer() -> None:
    text = render_final_answer("Who wrote it?", "the captain")
    assert "\\boxed{}" in text and "\\boxed{{}}" not in text
    assert _blocks_in_order(
        text, ["<problem>", "Who wrote it?", "</problem>", "<memory>", "the captain", "</memory>"]
    )
    assert "<section>" not in text
    assert text.rstrip("\n").endswith("Your answer:")


def test_braces_in_question_memory_and_chunk_are_kept_verbatim() -> None:
    text = render_memory_update("f({x})?", "{memory}", "a {chunk} b")
    assert "f({x})?" in text and "{memory}" in text and "a {chunk} b" in text


def test_prompt_renders_as_one_user_message_with_default_system_and_generation_prompt(tiny_tokenizer) -> None:
    content = render_memory_update("q?", "No previous memory", "some text")
    rendered = tiny_tokenizer.apply_chat_template(
        list(user_message(content)), tokenize=False, add_generation_prompt=True
    )
    assert rendered.startswith("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n")
    assert f"<|im_start|>user\n{content}<|im_end|>\n" in rendered
    assert rendered.endswith("<|im_start|>assistant\n")


def test_question_within_budget_is_unchanged(tiny_tokenizer) -> None:
    question = "What is the special magic number for the river?"
    assert fit_question(question, tiny_tokenizer, 1024) == question


def test_question_over_budget_keeps_its_last_tokens(tiny_tokenizer) -> None:
    question = "Read the documents carefully and answer. " * 20 + "Question: who wrote the letter?"
    ids = tiny_tokenizer(question, add_special_tokens=False)["input_ids"]
    fitted = fit_question(question, tiny_tokenizer, 12)
    assert fitted == tiny_tokenizer.decode(ids[-12:])
    assert fitted.endswith("who wrote the letter?")
    assert len(tiny_tokenizer(fitted, add_special_tokens=False)["input_ids"]) <= 12


def test_memory_config_defaults_are_paper_scale() -> None:
    config = WorkflowConfig()
    assert (config.chunk_tokens, config.memory_tokens, config.answer_tokens) == (5000, 1024, 1024)
    assert config.max_chunks == 8 and config.max_document_tokens == 40_000
    assert config.initial_memory == "No previous memory"
    assert WorkflowConfig(max_chunks=None).max_document_tokens is None


@pytest.mark.parametrize(
    "field", ["chunk_tokens", "memory_tokens", "answer_tokens", "question_tokens", "max_chunks"]
)
def test_memory_config_rejects_non_positive_budgets(field: str) -> None:
    with pytest.raises(ValueError, match=field):
        WorkflowConfig(**{field: 0})


def test_section_first_prompt_puts_the_section_before_the_memory_and_keeps_everything_else() -> None:
    text = render_memory_update("Who wrote it?", "the captain", "The captain wrote it.", section_first=True)
    assert _blocks_in_order(text, ["<problem>", "Who wrote it?", "</problem>", "<section>", "The captain wrote it.",
                                   "</section>", "<memory>", "the captain", "</memory>"])
    assert text.rstrip("\n").endswith("Updated memory:")
    assert WorkflowConfig().section_first is False  # MemAgent's order stays the default


def test_section_first_prompts_of_two_memories_agree_up_to_the_end_of_the_section() -> None:
    a = render_memory_update("q?", "memory one", "the chunk text", section_first=True)
    b = render_memory_update("q?", "memory two", "the chunk text", section_first=True)
    shared = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
    assert shared > a.index("</section>")
    plain_a = render_memory_update("q?", "memory one", "the chunk text")
    plain_b = render_memory_update("q?", "memory two", "the chunk text")
    assert next(i for i, (x, y) in enumerate(zip(plain_a, plain_b)) if x != y) < plain_a.index("<section>")
