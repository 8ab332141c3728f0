"""The batching engine behind the HTTP server: a queue, one worker thread, shared generate calls, failure isolation.

Each HTTP request runs on its own thread and parks in a queue; the worker takes everything pending (up to
`max_batch`), groups it by sampling settings and seed, and answers each group with ONE `LocalLLM.complete` call.
Requests are validated before they get here (memagent.server.requests); if a group still fails, it is retried one
request at a time, so only the request that fails on its own gets an error and the others get their completions.
A request past the timeout gets its 504 at once and its rows stop at the next decode step of the batch it is in
(`generate`'s `cancelled` events); the other rows of that batch go on as if it had not been there.

KV-cache budget (`kv_cache_budget_bytes`, 0 = none). Each batch is cut into generate calls that fit it
(`LocalLLM.call_slices`: one client asking for 8K tokens shrinks only the call it is in), and every request is
checked on arrival: its max_tokens is clamped to the room the budget leaves after its prompt, as the window clamps
it (memagent.server.requests), and a prompt that leaves no room at all is refused with a 400 naming the limit.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import torch
from transformers import PreTrainedTokenizerBase

from memagent.records import ChatRequest, Completion
from memagent.rollout.llm import LocalLLM
from memagent.rollout.sampling import SamplingParams
from memagent.server.requests import ApiError


class RequestTimeout(Exception):
    """The request did not finish within the engine's per-request timeout."""


def complete_isolated(llm: LocalLLM, requests: list[ChatRequest],
                      cancelled: Sequence[threading.Event] | None = None) -> list[Completion | Exception]:
    """One completion per request from one batched call; if the batch raises, each request alone.

    Returns the exception in the place of a request that fails by itself; under greedy sampling the others are
    exactly what the batch would have given them. cancelled: one event per request; a set one stops its request.
    """
    try:
        return list(llm.complete(requests, cancelled))
    except Exception:  # noqa: BLE001 (any failure: fall back to isolating the request that causes it)
        if len(requests) == 1:
            raise
    results: list[Completion | Exception] = []
    for i, request in enumerate(requests):
        try:
            results.append(llm.complete([request], None if cancelled is None else [cancelled[i]])[0])
        except Exception as e:  # noqa: BLE001 (reported to that one client as a 500)
            results.append(e)
    return results


@dataclass
class _Pending:
    """One request waiting for the worker; the HTTP thread blocks on `done`."""

    request: ChatRequest
    params: SamplingParams
    seed: int | None
    done: threading.Event = field(default_factory=threading.Event)
    completion: Completion | None = None
    error: str | None = None
    cancelled: threading.Event = field(default_factory=threading.Event)
    """Set when the client's wait timed out: the worker skips the request, or its rows stop at the next decode step."""


class BatchingEngine:
    """A queue and one worker thread that drains pending requests into shared `complete()` calls."""

    def __init__(self, model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, *, max_batch: int = 32,
                 seed: int = 0, timeout_s: float | None = None, kv_cache_budget_bytes: float = 0.0) -> None:
        if max_batch < 1:
            raise ValueError(f"BatchingEngine: max_batch must be >= 1, got {max_batch}")
        if timeout_s is not None and timeout_s <= 0:
            raise ValueError(f"BatchingEngine: timeout_s must be > 0 or None (no limit), got {timeout_s}")
        if kv_cache_budget_bytes < 0:
            raise ValueError(f"BatchingEngine: kv_cache_budget_bytes must be >= 0 (0 = none), "
                             f"got {kv_cache_budget_bytes}")
        self.model, self.tokenizer, self.max_batch, self.timeout_s = model, tokenizer, max_batch, timeout_s
        self.kv_cache_budget_bytes = kv_cache_budget_bytes
        self.row_tokens = LocalLLM(model, tokenizer, kv_cache_budget_bytes=kv_cache_budget_bytes).max_row_tokens()
        """The most tokens (prompt + max_tokens) one request may hold within the KV-cache budget; None without one."""
        self.device = next(model.parameters()).device
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self.batches: list[int] = []
        """Size of every batch the worker ran, in order (for tests and logs)."""
        self._queue: queue.Queue[_Pending | None] = queue.Queue()
        self._worker = threading.Thread(target=self._run, name="memagent-serve-worker", daemon=True)
        self._worker.start()

    @property
    def queued(self) -> int:
        """Requests waiting for the worker (for tests and logs)."""
        return self._queue.qsize()

    @property
    def window(self) -> int | None:
        """The model's context window in tokens (config max_position_embeddings), None when unknown."""
        return getattr(getattr(self.model, "config", None), "max_position_embeddings", None)

    def within_budget(self, request: ChatRequest) -> ChatRequest:
        """The request with max_new_tokens clamped to the room the KV-cache budget leaves after its prompt.

        Raises ApiError(400, code "kv_cache_budget_exceeded") when the prompt alone leaves no room.
        """
        if self.row_tokens is None:
            return request
        prompt = len(self.tokenizer.apply_chat_template(list(request.messages), add_generation_prompt=True,
                                                        tokenize=True, return_dict=False))
        room = self.row_tokens - prompt
        if room < 1:
            raise ApiError(400, f"the prompt is {prompt} tokens; the server's KV-cache budget of "
                                f"{self.kv_cache_budget_bytes:.0f} bytes holds {self.row_tokens} tokens per request "
                                "(prompt + max_tokens), leaving no room to answer",
                           param="messages", code="kv_cache_budget_exceeded")
        return replace(request, max_new_tokens=min(request.max_new_tokens, room))

    def submit(self, request: ChatRequest, params: SamplingParams, seed: int | None) -> Completion:
        """Queue one request (`within_budget`) and wait for its completion.

        Raises ApiError(400) when the prompt alone exceeds the KV-cache budget, RequestTimeout after `timeout_s`,
        RuntimeError if generating this request failed.
        """
        pending = _Pending(self.within_budget(request), params, seed)
        timeout_s = self.timeout_s  # the limit in force when the request joins the queue
        self._queue.put(pending)
        if not pending.done.wait(timeout_s):
            pending.cancelled.set()
            raise RequestTimeout(f"the request did not finish within {timeout_s:g} s")
        if pending.error is not None:
            raise RuntimeError(pending.error)
        assert pending.completion is not None
        return pending.completion

    def close(self) -> None:
        """Stop the worker after the requests already queued."""
        self._queue.put(None)
        self._worker.join()

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch = [first]
            while len(batch) < self.max_batch:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:  # close() arrived: finish this batch, then stop
                    self._queue.put(None)
                    break
                batch.append(item)
            groups: dict[tuple[SamplingParams, int | None], list[_Pending]] = {}
            for item in batch:
                if not item.cancelled.is_set():
                    groups.setdefault((item.params, item.seed), []).append(item)
            for (params, seed), group in groups.items():
                self._complete_group(params, seed, group)

    def _complete_group(self, params: SamplingParams, seed: int | None, group: list[_Pending]) -> None:
        generator = self.generator if seed is None else torch.Generator(device=self.device).manual_seed(seed)
        llm = LocalLLM(self.model, self.tokenizer, params=params, generator=generator,
                       kv_cache_budget_bytes=self.kv_cache_budget_bytes)
        self.batches.append(len(group))
        try:
            results = complete_isolated(llm, [item.request for item in group], [item.cancelled for item in group])
        # The worker must outlive anything: report the error to the waiting client instead of leaving it blocked.
        except Exception as e:  # noqa: BLE001
            results = [e]
        for item, result in zip(group, results):
            if isinstance(result, Exception):
                item.error = f"{type(result).__name__}: {result}"
            else:
                item.completion = result
            item.done.set()
