"""The full-context baseline: answer from the whole document in one prompt, middle-truncated to the window.

This is how MemAgent evaluates plain long-context models (taskutils/memory_eval/run.py: 120K in + 10K out, middle
truncation): when the document does not fit, its middle is dropped (first half + last half of the token budget,
`center_truncate`), so facts at the start and the end survive and the ones in between are lost. Comparing it with
the workflow on the same samples shows what the memory buys once documents outgrow the window.

The budget is exact: window minus the answer budget minus the tokens of the chat-templated prompt around the
document. Decoding the kept ids and re-encoding them inside the prompt can shift a few tokens at the seams, so the
rendered prompt is measured and the document shrunk by the excess until it fits.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from transformers import PreTrainedTokenizerBase

from memagent.records import ChatRequest, Sample
from memagent.rollout.chunking import center_truncate, tokenize_document
from memagent.rollout.prompts import Messages, fit_question, user_message

FULL_CONTEXT_TEMPLATE = """\
Below are a problem and an article that may contain what the problem asks for. Read the article, solve the \
problem, and put the final answer in \\boxed{{}}.

<problem>
{problem}
</problem>

<article>
{document}
</article>

Your answer:
"""
"""The single-prompt baseline's prompt; fields problem, document. Same answer format as the workflow's."""

_MAX_FIT_ROUNDS = 8
"""Shrink rounds before giving up; seams move a handful of tokens, so one or two rounds are the norm."""


@dataclass(frozen=True)
class FullContextPrompt:
    """The baseline's request for one sample, with how much of the document it kept."""

    request: ChatRequest
    """One user message holding the (possibly truncated) document; max_new_tokens = the answer budget."""
    document_tokens: int
    """Tokens of the whole document."""
    kept_tokens: int
    """Document tokens kept in the prompt (== document_tokens when nothing was cut)."""
    prompt_tokens: int
    """Tokens of the chat-templated prompt; prompt_tokens + answer budget <= window."""


def prompt_length(tokenizer: PreTrainedTokenizerBase, messages: Messages) -> int:
    """Tokens of `messages` rendered by the chat template with the generation prompt."""
    text = tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def full_context_prompt(
    sample: Sample,
    tokenizer: PreTrainedTokenizerBase,
    *,
    window: int,
    answer_tokens: int,
    question_tokens: int,
) -> FullContextPrompt:
    """Build the baseline request for `sample` so that prompt + answer_tokens fit in `window` tokens."""
    problem = fit_question(sample.question, tokenizer, question_tokens)
    ids = tokenize_document(sample.context, tokenizer)

    def render(document: str) -> Messages:
        return user_message(FULL_CONTEXT_TEMPLATE.format(problem=problem, document=document))

    budget = window - answer_tokens - prompt_length(tokenizer, render(""))
    if budget < 1:
        raise ValueError(
            f"window={window} leaves no room for the document after answer_tokens={answer_tokens} and the prompt; "
            "pass a larger --window or smaller --answer-tokens"
        )
    for _ in range(_MAX_FIT_ROUNDS):
        kept = center_truncate(ids, budget)
        messages = render(_decode_kept(tokenizer, kept, cut=len(kept) < len(ids)))
        length = prompt_length(tokenizer, messages)
        excess = length + answer_tokens - window
        if excess <= 0:
            request = ChatRequest(messages=messages, max_new_tokens=answer_tokens)
            return FullContextPrompt(request, len(ids), len(kept), length)
        budget -= excess
    raise RuntimeError(f"could not fit sample {sample.index} into window={window} after {_MAX_FIT_ROUNDS} rounds")


def _decode_kept(tokenizer: PreTrainedTokenizerBase, kept: np.ndarray, *, cut: bool) -> str:
    """Decode the kept ids; when the middle was cut, decode the halves apart so no token straddles the cut."""
    if not cut:
        return tokenizer.decode(kept.tolist(), skip_special_tokens=True)
    head = len(kept) // 2
    first = tokenizer.decode(kept[:head].tolist(), skip_special_tokens=True)
    last = tokenizer.decode(kept[head:].tolist(), skip_special_tokens=True)
    return first + last
