"""Serve a local model through our own engine (LocalLLM) behind an OpenAI-compatible chat API.

    python -m memagent.serve --model DIR [--host 127.0.0.1 --port 8000]

Endpoints: POST /v1/chat/completions (messages, max_tokens, temperature, top_p, seed; n must be 1, no streaming)
and GET /v1/models. It binds to loopback by default: there is no authentication, so exposing it is your call.

Batching: each HTTP request runs on its own thread (ThreadingHTTPServer) and parks in a queue; one worker thread
takes everything pending (up to --max-batch), groups it by sampling settings, and answers each group with ONE
`LocalLLM.complete` call, i.e. one shared generate batch. Concurrent clients (the API backend fires `concurrency`
requests at once) therefore fill a batch the way the in-process scheduler does. Requests that carry a seed get a
generator seeded with it, so they are reproducible when their batch is; the rest share one server generator.
"""

from __future__ import annotations

import argparse
import json
import queue
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from memagent.rollout.llm import LocalLLM
from memagent.rollout.records import ChatRequest, Completion
from memagent.rollout.sampling import SamplingParams


@dataclass
class _Pending:
    """One request waiting for the worker; the HTTP thread blocks on `done`."""

    request: ChatRequest
    params: SamplingParams
    seed: int | None
    done: threading.Event = field(default_factory=threading.Event)
    completion: Completion | None = None
    error: str | None = None


class BatchingEngine:
    """A queue and one worker thread that drains pending requests into shared `complete()` calls."""

    def __init__(self, model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, *, max_batch: int = 32,
                 seed: int = 0) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.model, self.tokenizer, self.max_batch = model, tokenizer, max_batch
        self.device = next(model.parameters()).device
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self.batches: list[int] = []
        """Size of every batch the worker ran, in order (for tests and logs)."""
        self._queue: queue.Queue[_Pending | None] = queue.Queue()
        self._worker = threading.Thread(target=self._run, name="memagent-serve-worker", daemon=True)
        self._worker.start()

    def submit(self, request: ChatRequest, params: SamplingParams, seed: int | None) -> Completion:
        """Queue one request and wait for its completion; raises RuntimeError if generation failed."""
        pending = _Pending(request, params, seed)
        self._queue.put(pending)
        pending.done.wait()
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
                groups.setdefault((item.params, item.seed), []).append(item)
            for (params, seed), group in groups.items():
                self._complete_group(params, seed, group)

    def _complete_group(self, params: SamplingParams, seed: int | None, group: list[_Pending]) -> None:
        generator = self.generator if seed is None else torch.Generator(device=self.device).manual_seed(seed)
        llm = LocalLLM(self.model, self.tokenizer, params=params, generator=generator)
        self.batches.append(len(group))
        try:
            completions = llm.complete([item.request for item in group])
        # The worker must outlive any one bad batch (e.g. a prompt longer than the model supports): report the
        # error to each waiting client as a 500 instead of leaving them blocked forever.
        except Exception as e:  # noqa: BLE001
            for item in group:
                item.error = f"{type(e).__name__}: {e}"
                item.done.set()
            return
        for item, completion in zip(group, completions):
            item.completion = completion
            item.done.set()


def parse_chat_body(body: Any, default_max_tokens: int) -> tuple[ChatRequest, SamplingParams, int | None]:
    """Validate an OpenAI chat-completions body; raises ValueError with a client-facing message."""
    if not isinstance(body, dict):
        raise ValueError("the body must be a JSON object")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ValueError("'messages' must be a non-empty list")
    for i, m in enumerate(messages):
        if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
            raise ValueError(f"messages[{i}] must be an object with string 'role' and 'content'")
    if body.get("stream"):
        raise ValueError("streaming is not supported")
    if body.get("n", 1) != 1:
        raise ValueError("only n=1 is supported")
    max_tokens = body.get("max_tokens", body.get("max_completion_tokens", default_max_tokens))
    if not isinstance(max_tokens, int) or max_tokens < 1:
        raise ValueError(f"'max_tokens' must be a positive integer, got {max_tokens!r}")
    seed = body.get("seed")
    if seed is not None and not isinstance(seed, int):
        raise ValueError(f"'seed' must be an integer, got {seed!r}")
    try:
        params = SamplingParams(temperature=float(body.get("temperature", 1.0)), top_p=float(body.get("top_p", 1.0)))
    except (TypeError, ValueError) as e:
        raise ValueError(f"bad sampling settings: {e}") from e
    messages = tuple({"role": m["role"], "content": m["content"]} for m in messages)
    return ChatRequest(messages=messages, max_new_tokens=max_tokens), params, seed


def completion_body(completion: Completion, model_name: str) -> dict[str, Any]:
    """The chat.completion JSON for one completion."""
    prompt, generated = len(completion.prompt_ids), len(completion.response_ids)
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model_name,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": completion.text},
            "finish_reason": "stop" if completion.finished else "length",
        }],
        "usage": {"prompt_tokens": prompt, "completion_tokens": generated, "total_tokens": prompt + generated},
    }


class ChatServer(ThreadingHTTPServer):
    """The HTTP server; `url` is the API base ("http://host:port/v1"). Port 0 picks a free port."""

    daemon_threads = True

    def __init__(self, engine: BatchingEngine, *, host: str = "127.0.0.1", port: int = 8000,
                 model_name: str = "memagent", default_max_tokens: int = 1024, verbose: bool = False) -> None:
        super().__init__((host, port), _Handler)
        self.engine, self.model_name = engine, model_name
        self.default_max_tokens, self.verbose = default_max_tokens, verbose
        self.url = f"http://{host}:{self.server_address[1]}/v1"
        self._thread: threading.Thread | None = None

    def start_in_thread(self) -> threading.Thread:
        """Serve on a daemon thread (tests, notebooks); stop with close()."""
        self._thread = threading.Thread(target=self.serve_forever, name="memagent-serve-http", daemon=True)
        self._thread.start()
        return self._thread

    def close(self) -> None:
        """Stop serving (when started with start_in_thread), release the port and stop the engine's worker."""
        if self._thread is not None:  # shutdown() waits for a serve_forever loop, so only call it when one runs
            self.shutdown()
            self._thread.join()
        self.server_close()
        self.engine.close()


class _Handler(BaseHTTPRequestHandler):
    server: ChatServer

    def do_GET(self) -> None:  # noqa: N802 (the http.server naming)
        if self.path.rstrip("/") != "/v1/models":
            return self._send(404, {"error": {"message": f"no route {self.path}"}})
        model = {"id": self.server.model_name, "object": "model", "created": 0, "owned_by": "memagent"}
        self._send(200, {"object": "list", "data": [model]})

    def do_POST(self) -> None:  # noqa: N802
        if self.path.rstrip("/") != "/v1/chat/completions":
            return self._send(404, {"error": {"message": f"no route {self.path}"}})
        try:
            length = int(self.headers.get("Content-Length", "0"))
            body = json.loads(self.rfile.read(length))
            request, params, seed = parse_chat_body(body, self.server.default_max_tokens)
        except ValueError as e:  # json.JSONDecodeError is a ValueError too
            return self._send(400, {"error": {"message": str(e), "type": "invalid_request_error"}})
        try:
            completion = self.server.engine.submit(request, params, seed)
        except RuntimeError as e:
            return self._send(500, {"error": {"message": str(e), "type": "server_error"}})
        self._send(200, completion_body(completion, self.server.model_name))

    def _send(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        if self.server.verbose:
            super().log_message(format, *args)


def main(argv: list[str] | None = None) -> None:
    from memagent.model import load_model, load_tokenizer

    parser = argparse.ArgumentParser(description="Serve a local model with an OpenAI-compatible chat API.")
    parser.add_argument("--model", required=True, help="HF model directory (config, weights, tokenizer)")
    parser.add_argument("--host", default="127.0.0.1", help="bind address; loopback by default (no auth!)")
    parser.add_argument("--port", type=int, default=8000, help="port; 0 picks a free one")
    parser.add_argument("--name", default=None, help="model name reported by the API (default: the dir name)")
    parser.add_argument("--max-batch", type=int, default=32, help="most requests generated together")
    parser.add_argument("--default-max-tokens", type=int, default=1024, help="max_tokens when a request omits it")
    parser.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    parser.add_argument("--dtype", default=None, help="float32, bfloat16, float16 or auto (default float32)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the generator shared by unseeded requests")
    parser.add_argument("--verbose", action="store_true", help="log every HTTP request")
    args = parser.parse_args(argv)

    model = load_model(args.model, dtype=args.dtype, device=args.device).eval()
    tokenizer = load_tokenizer(args.model)
    engine = BatchingEngine(model, tokenizer, max_batch=args.max_batch, seed=args.seed)
    server = ChatServer(engine, host=args.host, port=args.port, model_name=args.name or Path(args.model).name,
                        default_max_tokens=args.default_max_tokens, verbose=args.verbose)
    print(f"serving {args.model} at {server.url} (Ctrl-C to stop)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        engine.close()


if __name__ == "__main__":
    main()
