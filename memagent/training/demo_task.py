"""The embedded demo's task, and its oracle memory traces for the supervised warm start.

Task "code_lookup": a document of short lines, one chunk = exactly `chunk_tokens` tokens of whole lines, so a fact
never straddles two chunks. One line is the needle "the code for {key} is {value}." (key: adjective-noun, value:
three digits); every chunk also holds one distractor code line with another key, and filler lines. Question: "What
is the code for {key}?"; answer: the value. Memory must be selective (distractors) and must survive overwriting
(the needle is in a random chunk, later chunks bring new distractors), which is what MemAgent's RL trains.

Oracle (the warm start's targets, exactly the conversations the workflow produces, same prompts): the memory after
each chunk is the needle line once it has been seen (the initial memory before), the final answer \\boxed{value}.
`OracleLLM` is an LLM backend (memagent.rollout.llm.LLM) that answers the workflow's requests with these texts,
so `run_memagent` itself renders the prompts.
"""

from __future__ import annotations

import random
import re

import torch
from transformers import PreTrainedTokenizerBase

from memagent.data.records import Sample
from memagent.data.words import ADJECTIVES, NOUNS
from memagent.rollout.llm import stop_token_ids
from memagent.rollout.prompts import MEMORY_UPDATE_TEMPLATE, render_final_answer
from memagent.rollout.records import ChatRequest, Completion

FILLERS = ("the grass is green.", "the sky is blue.", "the sun is yellow.", "here we go.", "there and back again.",
           "the river is calm.", "a bird sings at dawn.", "the road is long.")
PAD_WORD = " la"
NEEDLE = "the code for {key} is {value}."
QUESTION = "What is the code for {key}?"


def _key(rng: random.Random) -> str:
    return f"{rng.choice(ADJECTIVES[:16])}-{rng.choice(NOUNS[:16])}"


def corpus(num_samples: int = 1000, seed: int = 0) -> list[str]:
    """Task and prompt text for training the tiny tokenizer, so the demo tokenizes compactly."""
    rng = random.Random(seed)
    texts = [MEMORY_UPDATE_TEMPLATE.format(problem="q", memory="m", chunk="c"), render_final_answer("q", "m")] * 20
    for _ in range(num_samples):
        key, value = _key(rng), f"{rng.randint(100, 999)}"
        texts += [NEEDLE.format(key=key, value=value), QUESTION.format(key=key), f"\\boxed{{{value}}}",
                  " ".join(rng.choice(FILLERS) for _ in range(4)), PAD_WORD * 8, "No previous memory"]
    return texts


def _count(tokenizer: PreTrainedTokenizerBase, text: str) -> int:
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def _chunk_text(lines: list[str], chunk_tokens: int, tokenizer: PreTrainedTokenizerBase, rng: random.Random) -> str:
    """Lines (each ending in a newline) plus fillers and a pad line, exactly chunk_tokens tokens in total."""
    used = sum(_count(tokenizer, line) for line in lines)
    while True:
        filler = rng.choice(FILLERS) + "\n"
        if chunk_tokens - used - _count(tokenizer, filler) < 4:
            break
        lines.insert(rng.randrange(len(lines) + 1), filler)
        used += _count(tokenizer, filler)
    rest = chunk_tokens - used
    pads = ["la" + PAD_WORD * n + "\n" for n in range(rest + 1)]
    lines += [p for p in pads if _count(tokenizer, p) == rest][:1]
    text = "".join(lines)
    if _count(tokenizer, text) != chunk_tokens:
        raise ValueError(f"code_lookup: could not build a chunk of exactly {chunk_tokens} tokens with this tokenizer")
    return text


def generate_code_lookup(tokenizer: PreTrainedTokenizerBase, *, num_chunks: int, chunk_tokens: int,
                         num_samples: int, seed: int) -> list[Sample]:
    """`num_samples` questions over documents of exactly num_chunks * chunk_tokens tokens (chunk-aligned lines)."""
    rng = random.Random(seed)
    samples = []
    for index in range(num_samples):
        key, value = _key(rng), f"{rng.randint(100, 999)}"
        needle_chunk = rng.randrange(num_chunks)
        chunks = []
        for k in range(num_chunks):
            other = _key(rng)
            while other == key:
                other = _key(rng)
            lines = [NEEDLE.format(key=other, value=rng.randint(100, 999)) + "\n"]
            if k == needle_chunk:
                lines.insert(rng.randrange(2), NEEDLE.format(key=key, value=value) + "\n")
            chunks.append(_chunk_text(lines, chunk_tokens, tokenizer, rng))
        samples.append(Sample(context="".join(chunks), question=QUESTION.format(key=key), answers=[value],
                              task="code_lookup", index=index, length=num_chunks * chunk_tokens,
                              extra={"needle": NEEDLE.format(key=key, value=value), "needle_chunk": needle_chunk}))
    return samples


_BLOCK = re.compile(r"<(problem|memory|section)>\n(.*?)\n</\1>", re.S)


class OracleLLM:
    """An LLM backend that answers MemAgent's requests with the oracle memory and answer (see module docstring)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, samples: list[Sample], initial_memory: str) -> None:
        self.tokenizer = tokenizer
        self.by_question = {s.question: s for s in samples}
        self.initial_memory = initial_memory
        self.eos = stop_token_ids(tokenizer)[0]

    def _answer(self, content: str) -> str:
        blocks = dict(_BLOCK.findall(content))
        sample = self.by_question[blocks["problem"]]
        needle = str(sample.extra["needle"])
        if "section" in blocks:  # a memory update: keep the needle once seen
            seen = needle in blocks["memory"] or needle in blocks["section"]
            return needle if seen else self.initial_memory
        return f"\\boxed{{{sample.answers[0]}}}"

    def complete(self, requests: list[ChatRequest]) -> list[Completion]:
        out = []
        for request in requests:
            text = self._answer(request.messages[-1]["content"])
            prompt = self.tokenizer.apply_chat_template(list(request.messages), add_generation_prompt=True,
                                                        tokenize=True, return_dict=False)
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"][: request.max_new_tokens - 1]
            ids = ids + [self.eos]
            out.append(Completion(text=text, prompt_ids=list(prompt), response_ids=ids,
                                  logprobs=torch.zeros(len(ids)), finished=True))
        return out
