"""The embedded demo's task, and its oracle memory traces for the supervised warm start.

Task "code_lookup": a document of short lines, one chunk = exactly `chunk_tokens` tokens of whole lines, so a fact
never straddles two chunks. One line is the needle "code {key} {value}." (key: one of KEYS, value: one of
VALUES) in a random chunk; the rest are filler lines, plus `distractors` code lines with other keys per chunk (0 in
the demo). Question: "What is code {key}?"; answer: the value. Keys and values come from small closed word lists
that the tiny tokenizer learns as single tokens (`corpus`), so reading, keeping and answering are each a copy of
one token (docs/demo.md). The memory must survive overwriting: after the needle's chunk, every later
chunk brings only fillers, and a memory update that does not copy the memory forward loses the answer.

Oracle (the warm start's targets, exactly the conversations the workflow produces, same prompts): the memory after
each chunk is the needle line once it has been seen, "code {key} unknown." before, the final answer
\\boxed{value}. `OracleLLM` is an LLM backend (memagent.rollout.llm.LLM) that answers the workflow's requests with
these texts, so `run_memagent` itself renders the prompts. The demo's warm start uses it as a forgetful teacher
(`keep_probability` 0.2): a weak memory policy, so that what RL adds over imitation is measurable.
"""

from __future__ import annotations

import functools
import random
import re
from collections.abc import Callable
from dataclasses import dataclass

import torch
from transformers import PreTrainedTokenizerBase

from memagent.records import ChatRequest, Completion, Sample
from memagent.rollout.gates import ANSWER_NOW, KEEP, UPDATE
from memagent.rollout.llm import stop_token_ids
from memagent.rollout.prompts import (
    GATE_CHOICES,
    MEMORY_UPDATE_TEMPLATE,
    render_final_answer,
    render_memory_update,
)

# Fillers share no word with code lines (" code", keys, values, " unknown"), so a value token in a prompt is always
# the needle's (or, with distractors, another code line's).
FILLERS = ("here we go.", "there and back again.", "a bird sings at dawn.", "the road goes on.", "the wind blows.",
           "we walk home.", "the sun sets.", "the lake stays calm.")
PAD_WORD = " la"
# The value follows its key directly, and the memory keeps that form ("code {key} unknown." until the needle is
# seen), so every step copies one token of the prompt, never a yes/no decision.
NEEDLE = "code {key} {value}."
UNSEEN = "code {key} unknown."
QUESTION = "What is code {key}?"


KEYS = ("apple", "bell", "bridge", "candle", "castle", "cloud", "drum", "forest", "garden", "hammer", "island",
        "lamp", "mirror", "river", "stone", "tower")
VALUES = ("red", "blue", "green", "gold", "black", "white", "pink", "gray", "north", "south", "east", "west",
          "alpha", "beta", "delta", "omega")


def corpus(seed: int = 0) -> list[str]:
    """Task and prompt text for training the tiny tokenizer: every key and value, as the needle, question and
    answer spell them, is repeated often enough to become a single token; so are the gate words and decision lines
    of the gated prompt (docs/gates.md), so a KEEP costs one generated token as in a real tokenizer's vocabulary."""
    rng = random.Random(seed)
    texts = [MEMORY_UPDATE_TEMPLATE.format(problem="q", memory="m", chunk="c"), render_final_answer("q", "m"),
             render_memory_update("q", "m", "c", gates="both")] * 20 + [KEEP, f"{UPDATE}\n", ANSWER_NOW] * 400
    for _ in range(40):
        for key in KEYS:
            for value in rng.sample(VALUES, 4):
                texts += [NEEDLE.format(key=key, value=value), QUESTION.format(key=key), f"\\boxed{{{value}}}",
                          UNSEEN.format(key=key)]
    texts += [" ".join(rng.choice(FILLERS) for _ in range(4)) for _ in range(200)]
    return texts + [PAD_WORD * 8, "No previous memory"] * 100


def _count(tokenizer: PreTrainedTokenizerBase, text: str) -> int:
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def _chunk_text(lines: list[str], chunk_tokens: int, tokenizer: PreTrainedTokenizerBase, rng: random.Random,
                line_tokens: Callable[[str], int]) -> str:
    """Lines (each ending in a newline) plus fillers and a pad line, exactly chunk_tokens tokens in total.

    line_tokens counts one line's tokens; lines end in a newline, which this task's tokenizers never merge across, so
    a chunk's count is the sum of its lines' (checked on the whole chunk below).
    """
    used = sum(line_tokens(line) for line in lines)
    while True:
        filler = rng.choice(FILLERS) + "\n"
        if chunk_tokens - used - line_tokens(filler) < 4:
            break
        lines.insert(rng.randrange(len(lines) + 1), filler)
        used += line_tokens(filler)
    rest = chunk_tokens - used
    pads = ["la" + PAD_WORD * n + "\n" for n in range(rest + 1)]
    lines += [p for p in pads if line_tokens(p) == rest][:1]
    text = "".join(lines)
    if _count(tokenizer, text) != chunk_tokens:
        raise ValueError(f"code_lookup: could not build a chunk of exactly {chunk_tokens} tokens with this tokenizer")
    return text


def generate_code_lookup(tokenizer: PreTrainedTokenizerBase, *, num_chunks: int, chunk_tokens: int,
                         num_samples: int, seed: int, distractors: int = 0,
                         needle_last: bool = False) -> list[Sample]:
    """`num_samples` questions over documents of exactly num_chunks * chunk_tokens tokens (chunk-aligned lines).

    needle_last: the needle is always in the last chunk (else in a uniformly random one).
    """
    rng = random.Random(seed)
    # A document is a few dozen distinct lines repeated; counting each once instead of at every use was 11% of the
    # demo's time (BENCHMARKS.md, "make demo").
    line_tokens = functools.cache(functools.partial(_count, tokenizer))
    samples = []
    for index in range(num_samples):
        key, value = rng.choice(KEYS), rng.choice(VALUES)
        needle_chunk = num_chunks - 1 if needle_last else rng.randrange(num_chunks)
        chunks = []
        for k in range(num_chunks):
            others = rng.sample([o for o in KEYS if o != key], distractors)
            lines = [NEEDLE.format(key=o, value=rng.choice(VALUES)) + "\n" for o in others]
            if k == needle_chunk:
                lines.insert(rng.randrange(len(lines) + 1), NEEDLE.format(key=key, value=value) + "\n")
            chunks.append(_chunk_text(lines, chunk_tokens, tokenizer, rng, line_tokens))
        samples.append(Sample(context="".join(chunks), question=QUESTION.format(key=key), answers=[value],
                              task="code_lookup", index=index, length=num_chunks * chunk_tokens,
                              extra={"needle": NEEDLE.format(key=key, value=value), "needle_chunk": needle_chunk,
                                     "key": key}))
    return samples


_BLOCK = re.compile(r"<(problem|memory|section)>\n(.*?)\n</\1>", re.S)
_QUESTION_KEY = re.compile(re.escape(QUESTION.format(key="@")).replace("@", r"(\w+)"))


@dataclass(frozen=True)
class _Request:
    """What the oracle reads in one request: the asked key and where its needle is."""

    key: str
    in_memory: re.Match[str] | None
    """The needle in the memory block, None if absent."""
    in_section: re.Match[str] | None
    """The needle in the section block, None if absent."""
    has_section: bool
    """False for the final-answer request, which shows the memory alone."""


def _read_request(content: str) -> _Request:
    blocks = dict(_BLOCK.findall(content))
    key = _QUESTION_KEY.fullmatch(blocks["problem"]).group(1)  # type: ignore[union-attr]
    needle = re.compile(re.escape(NEEDLE.format(key=key, value="@")).replace("@", r"(?!unknown)(\w+)"))
    section = blocks.get("section")
    return _Request(key, needle.search(blocks["memory"]), needle.search(section) if section is not None else None,
                    section is not None)


class OracleLLM:
    """An LLM backend that answers MemAgent's requests with the oracle memory and answer (see module docstring).

    The oracle reads the request itself (the question's key, then the needle in the section or the memory), never
    a lookup by question text: the closed vocabulary makes many questions identical, and a lookup would give
    all of them one document's needle, i.e. targets unrelated to the document shown.

    keep_probability < 1 makes it a forgetful teacher: when the section has no needle but the memory has, it
    carries the needle forward only with this probability (a seeded draw per such request) and otherwise writes
    "code {key} unknown.", the mistake of a memory policy that rewrites the memory from the current section alone.

    A gated request (its prompt lists decision words, docs/gates.md) gets "KEEP" or "ANSWER" alone, or "UPDATE" and
    the memory on the next line. With chance `informed` the word follows the rule (ANSWER once the memory holds the
    needle, UPDATE on the needle's section, KEEP otherwise; the first of these on offer, UPDATE last); otherwise it
    is drawn blindly among the words on offer with the chances `decisions` (KEEP, UPDATE, ANSWER; renormalized over
    those offered), whatever the chunk holds. A blind teacher (informed 0) teaches the grammar alone and leaves
    when to keep, update or stop to RL.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, *, keep_probability: float = 1.0, seed: int = 0,
                 decisions: tuple[float, float, float] = (0.0, 1.0, 0.0), informed: float = 0.0) -> None:
        if not 0.0 <= keep_probability <= 1.0:
            raise ValueError(f"OracleLLM: keep_probability={keep_probability} must be in [0, 1]")
        if len(decisions) != 3 or min(decisions) < 0 or decisions[1] <= 0:
            raise ValueError(f"OracleLLM: decisions={decisions} must be three chances (KEEP, UPDATE, ANSWER) >= 0, "
                             "UPDATE > 0")
        if not 0.0 <= informed <= 1.0:
            raise ValueError(f"OracleLLM: informed={informed} must be in [0, 1]")
        self.tokenizer = tokenizer
        self.eos = stop_token_ids(tokenizer)[0]
        self.keep_probability = keep_probability
        self.decisions = dict(zip((KEEP, UPDATE, ANSWER_NOW), decisions))
        self.informed = informed
        self.rng = random.Random(seed)

    def _decide(self, content: str, request: _Request) -> str | None:
        """The gate word for a gated memory-update request (class docstring); None for any other request."""
        offered = [word for word in (KEEP, UPDATE, ANSWER_NOW) if GATE_CHOICES[word] in content]
        if not offered:
            return None
        if self.informed and self.rng.random() < self.informed:
            rule = (ANSWER_NOW, KEEP) if request.in_memory else (UPDATE,) if request.in_section else (KEEP,)
            return next((word for word in rule if word in offered), UPDATE)
        return self.rng.choices(offered, weights=[self.decisions[word] for word in offered])[0]

    def _answer(self, request: _Request) -> str:
        in_memory = request.in_memory
        if not request.has_section:  # the final answer, from the memory alone
            return f"\\boxed{{{in_memory.group(1) if in_memory else 'unknown'}}}"
        if request.in_section:
            return request.in_section.group(0)
        if in_memory and (self.keep_probability == 1.0 or self.rng.random() < self.keep_probability):
            return in_memory.group(0)
        return UNSEEN.format(key=request.key)

    def complete(self, requests: list[ChatRequest]) -> list[Completion]:
        out = []
        for request in requests:
            content = request.messages[-1]["content"]
            read = _read_request(content)
            decision = self._decide(content, read)
            text = self._answer(read)
            if decision is not None:
                text = f"{UPDATE}\n{text}" if decision == UPDATE else decision
            prompt = self.tokenizer.apply_chat_template(list(request.messages), add_generation_prompt=True,
                                                        tokenize=True, return_dict=False)
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"][: request.max_new_tokens - 1]
            # The engine stops right after KEEP or ANSWER (ChatRequest.stop_texts), with no end-of-turn token.
            ids = ids if decision in (KEEP, ANSWER_NOW) else ids + [self.eos]
            out.append(Completion(text=text, prompt_ids=list(prompt), response_ids=ids,
                                  logprobs=torch.zeros(len(ids)), finished=True))
        return out
