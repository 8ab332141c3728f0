"""The LLM backend interface agents talk to, and the local backend on our own generation engine.

A backend answers a batch of `ChatRequest`s in one call: the scheduler gathers every pending request of every
agent and sends them together, so a local backend fills one generation batch and an HTTP backend fires them
concurrently. Backends also carry the policy tokenizer, because MemAgent chunks documents and budgets prompts
in the policy's own tokens (docs/workflow.md), whichever process runs the model.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Protocol

import torch
from transformers import PreTrainedTokenizerBase

from memagent.model.shape import ModelShape, rows_per_call, shape_from_config, tokens_per_row_within
from memagent.records import ChatRequest, Completion
from memagent.rollout.constraints import TokenPrefixes, tokenize_prefixes
from memagent.rollout.generate import PLAIN_SAMPLING, StopRule, generate
from memagent.rollout.sampling import SamplingParams

END_TOKENS = ("<|im_end|>", "<|endoftext|>")
"""Tokens that end a turn besides the tokenizer's eos (ChatML end of turn, Qwen's end of text)."""


class LLM(Protocol):
    """Anything that completes a batch of chats: the local engine here, or an OpenAI-compatible client."""

    tokenizer: PreTrainedTokenizerBase | None
    """The policy tokenizer: chunks and budgets are counted in its tokens (None: plain chats only)."""

    def complete(self, requests: list[ChatRequest]) -> list[Completion]:
        """One completion per request, in request order, from one batched call."""
        ...


def stop_token_ids(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """Ids that end a response: the tokenizer's eos, then the `END_TOKENS` in its vocabulary, no repeats."""
    vocab = tokenizer.get_vocab()
    ids = [] if tokenizer.eos_token_id is None else [tokenizer.eos_token_id]
    for token in END_TOKENS:
        if token in vocab and vocab[token] not in ids:
            ids.append(vocab[token])
    return ids


def whole_response_stop(tokenizer: PreTrainedTokenizerBase, texts: tuple[str, ...]) -> StopRule:
    """The engine's rule for ChatRequest.stop_texts: end the row once its decoded response, stripped, is one of
    `texts`; give up (False) once it is no prefix of any, so only a row's first few tokens are ever decoded."""

    def rule(ids: list[int]) -> bool | None:
        so_far = tokenizer.decode(ids, skip_special_tokens=True).strip()
        if so_far in texts:
            return True
        return None if any(text.startswith(so_far) for text in texts) else False

    return rule


class LocalLLM:
    """A backend that renders chats with the tokenizer's chat template and samples with `generate`.

    Each request's messages go through `apply_chat_template(add_generation_prompt=True)`; the batch is one
    `generate` call (or consecutive calls of at most `max_batch_rows` rows, or as many as `kv_cache_budget_bytes`
    holds, `call_slices`: at paper scale one round can be 128 x 16 prompts of ~7K tokens) with each request's own
    max_new_tokens; responses are decoded with special tokens skipped. The budget bounds the cache's allocated
    bytes: `generate` never holds more than the call's rows x (longest prompt + largest max_new_tokens) positions.
    The Completion keeps the token ids and behaviour log-probs, which the trainer needs. A request's `stop_texts`
    end its row once the response is one of them (`whole_response_stop`; finished True, like an EOS); its
    `allowed_prefixes` constrain the row's first tokens to their tokenizations (memagent.rollout.constraints), and
    its log-probs stay the policy's unconstrained ones.
    share_prefill (default True) prefills identical prompts of one call once, and common prefixes of 32+ tokens
    once (`generate`, memagent.rollout.prefill): the G first-round prompts of a MemAgent group are one prefill, and
    in later rounds a group's template and problem are. The scheduler keeps a group's requests contiguous, so they share
    a call unless max_batch_rows or the KV-cache budget cuts the group.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: PreTrainedTokenizerBase,
        *,
        params: SamplingParams = PLAIN_SAMPLING,
        generator: torch.Generator | None = None,
        max_batch_rows: int | None = None,
        prefill_chunk_tokens: int = 0,
        kv_cache_budget_bytes: float = 0.0,
        share_prefill: bool = True,
    ) -> None:
        if max_batch_rows is not None and max_batch_rows < 1:
            raise ValueError(f"LocalLLM: max_batch_rows must be >= 1 or None (no cap), got {max_batch_rows}")
        if prefill_chunk_tokens < 0:
            raise ValueError(f"LocalLLM: prefill_chunk_tokens must be >= 0 (0 = one forward), got {prefill_chunk_tokens}")
        self.prefill_chunk_tokens = prefill_chunk_tokens
        self.kv_cache_budget_bytes = kv_cache_budget_bytes
        self.share_prefill = share_prefill
        self.model = model
        self.tokenizer = tokenizer
        self.params = params
        self.generator = generator
        self.max_batch_rows = max_batch_rows
        self.eos_token_ids = stop_token_ids(tokenizer)
        self._prefix_ids: dict[tuple[str, ...], TokenPrefixes] = {}  # allowed_prefixes, tokenized once per set
        if not self.eos_token_ids:
            raise ValueError(
                "LocalLLM: the tokenizer has no eos token and no <|im_end|>/<|endoftext|>: set an eos"
            )

    def _budget_shape(self) -> tuple[ModelShape, int]:
        """The model's shape and the bytes per element of its KV cache (bf16 under autocast)."""
        weight = next(self.model.parameters())
        dtype_bytes = 2 if torch.is_autocast_enabled(weight.device.type) else weight.element_size()
        return shape_from_config(self.model.config.to_dict(), "LocalLLM model"), dtype_bytes

    def rows_per_call(self, prompts: list[list[int]], max_new_tokens: list[int]) -> int:
        """Rows per generate call for rows as long as the longest prompt plus the largest max_new_tokens given: what
        the KV-cache budget holds (when one is set), capped by max_batch_rows; all of them when neither is set."""
        if self.kv_cache_budget_bytes <= 0:
            return self.max_batch_rows or len(prompts)
        shape, dtype_bytes = self._budget_shape()
        tokens = max(len(p) for p in prompts) + max(max_new_tokens)
        return rows_per_call(shape, self.kv_cache_budget_bytes, tokens, self.prefill_chunk_tokens,
                             cap=self.max_batch_rows, dtype_bytes=dtype_bytes)

    def call_slices(self, prompts: list[list[int]], max_new_tokens: list[int]) -> list[tuple[int, int]]:
        """[start, end) of each generate call, consecutive in request order (a group's requests stay together).

        With a KV-cache budget each call takes as many requests as `rows_per_call` allows at the call's *own*
        longest prompt and largest max_new_tokens, so one long request shrinks only the call it is in, not every
        call of the batch (a server batch of 31 short requests and one of 8K tokens). Greedy: for this order, no
        split has fewer calls. Without a budget: slices of max_batch_rows (all in one call when that is None).
        """
        if self.kv_cache_budget_bytes <= 0:
            rows = self.max_batch_rows or len(prompts)
            return [(start, min(start + rows, len(prompts))) for start in range(0, len(prompts), rows)]
        shape, dtype_bytes = self._budget_shape()
        slices, start, longest, most = [], 0, 0, 0  # the open call: its first request, longest prompt, largest limit
        for i, (prompt, limit) in enumerate(zip(prompts, max_new_tokens)):
            with_it = (max(longest, len(prompt)), max(most, limit))
            rows = rows_per_call(shape, self.kv_cache_budget_bytes, sum(with_it), self.prefill_chunk_tokens,
                                 cap=self.max_batch_rows, dtype_bytes=dtype_bytes)
            if i > start and i + 1 - start > rows:  # request i does not fit the open call: it opens the next one
                slices.append((start, i))
                start, with_it = i, (len(prompt), limit)
            longest, most = with_it
        return slices + [(start, len(prompts))]

    def max_row_tokens(self) -> int | None:
        """The most tokens (prompt + max_new_tokens) one request may hold within the KV-cache budget even alone;
        None without a budget."""
        if self.kv_cache_budget_bytes <= 0:
            return None
        shape, dtype_bytes = self._budget_shape()
        return tokens_per_row_within(shape, self.kv_cache_budget_bytes, self.prefill_chunk_tokens, dtype_bytes)

    def render(self, request: ChatRequest) -> list[int]:
        """Prompt token ids of one request: chat template applied, generation prompt added."""
        return self.tokenizer.apply_chat_template(
            list(request.messages), add_generation_prompt=True, tokenize=True, return_dict=False
        )

    def _tokenized(self, texts: tuple[str, ...]) -> TokenPrefixes:
        """A request's allowed_prefixes as token ids (a gated rollout asks for the same few sets every round)."""
        if texts not in self._prefix_ids:
            self._prefix_ids[texts] = tokenize_prefixes(self.tokenizer, texts)
        return self._prefix_ids[texts]

    def complete(self, requests: list[ChatRequest],
                 cancelled: Sequence[threading.Event] | None = None) -> list[Completion]:
        """One completion per request, in request order. cancelled: one event per request (the server's timeouts);
        a request whose event is set stops generating at the next decode step and gets what it has so far."""
        if not requests:
            return []
        prompts = [self.render(r) for r in requests]
        pad = self.tokenizer.pad_token_id
        limits = [r.max_new_tokens for r in requests]
        rules = [whole_response_stop(self.tokenizer, r.stop_texts) if r.stop_texts else None for r in requests]
        any_rule = any(rule is not None for rule in rules)
        openings = [self._tokenized(r.allowed_prefixes) if r.allowed_prefixes else None for r in requests]
        any_opening = any(opening is not None for opening in openings)
        sampled: list[list[int]] = []
        sampled_logprobs: list[torch.Tensor] = []
        ended: list[bool] = []
        for start, end in self.call_slices(prompts, limits):
            out = generate(
                self.model,
                prompts[start:end],
                max_new_tokens=limits[start:end],
                eos_token_id=self.eos_token_ids,
                params=self.params,
                generator=self.generator,
                pad_token_id=self.eos_token_ids[0] if pad is None else pad,
                vocab_size=len(self.tokenizer),  # never an embedding-padding id (Qwen2.5: 152064 rows, 151665 tokens)
                prefill_chunk_tokens=self.prefill_chunk_tokens,
                share_prefill=self.share_prefill,
                cancelled=None if cancelled is None else cancelled[start:end],
                stop_rules=rules[start:end] if any_rule else None,
                allowed_prefixes=openings[start:end] if any_opening else None,
            )
            sampled += out.tokens
            sampled_logprobs += out.logprobs
            ended += out.finished
        return [
            Completion(
                text=self.tokenizer.decode(tokens, skip_special_tokens=True),
                prompt_ids=prompt,
                response_ids=tokens,
                logprobs=logprobs,
                finished=finished,
            )
            for prompt, tokens, logprobs, finished in zip(prompts, sampled, sampled_logprobs, ended)
        ]
