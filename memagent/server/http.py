"""The OpenAI-compatible HTTP front of the batching engine: routes, status codes, access control, shutdown.

Status codes: 400 for a body the client got wrong (the error names the field) or a Content-Length that is not one
non-negative integer, 401 without the API key, 404 for an unknown route, 411 for a chunked body, 413 for a body over
`max_body_bytes`, 503 while shutting down, 504 past the per-request timeout (its rows leave the batch at the next
decode step), 500 for our own faults (the server keeps serving). Error bodies are OpenAI's {"error": {"message",
"type", "param", "code"}}.
"""

from __future__ import annotations

import hmac
import json
import threading
import time
import uuid
from collections.abc import Callable
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from memagent.records import Completion
from memagent.server.engine import BatchingEngine, RequestTimeout
from memagent.server.requests import ApiError, parse_chat_body

LOOPBACK = ("127.0.0.1", "localhost", "::1")
"""Bind addresses reachable only from this machine."""


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


def body_length(headers: Message, limit: int) -> int:
    """The request body's length in bytes, or an ApiError that refuses the body before any of it is read.

    The body must come with one Content-Length of digits only (RFC 9110, section 8.6), at most `limit` bytes: 400
    otherwise, 413 past the limit. int() alone let "-1" through, and rfile.read(-1) then read until the client hung
    up, past any limit. A body sent with Transfer-Encoding (chunked) gets 411: OpenAI clients send JSON with a
    Content-Length, and a chunked parser of our own would be one more way to read past the limit. No Content-Length
    at all is an empty body.
    """
    if headers.get("Transfer-Encoding") is not None:
        raise ApiError(411, "send the body with a Content-Length header; Transfer-Encoding is not supported",
                       code="length_required")
    values = {value.strip() for value in headers.get_all("Content-Length", ["0"])}
    value = next(iter(values)) if len(values) == 1 else ""
    if not (value.isascii() and value.isdigit()):
        raise ApiError(400, f"the Content-Length header must be one non-negative integer, got {sorted(values)}",
                       code="invalid_content_length")
    digits = value.lstrip("0") or "0"
    if len(digits) > len(str(limit)) or int(digits) > limit:  # int() refuses strings of over 4300 digits
        raise ApiError(413, f"the Content-Length is over the limit of {limit} bytes", code="request_too_large")
    return int(digits)


class ChatServer(ThreadingHTTPServer):
    """The HTTP server; `url` is the API base ("http://host:port/v1"). Port 0 picks a free port.

    api_key: when set, every request needs "Authorization: Bearer <api_key>" (compared in constant time).
    max_body_bytes: larger request bodies are refused with 413 before they are read.
    window: prompt + max_tokens limit in tokens (default: the model's max_position_embeddings).
    """

    daemon_threads = True
    # socketserver's default backlog of 5 overflowed under a burst of concurrent clients: the kernel then reset some
    # connections before they reached us (nstat's ListenOverflows), and those clients saw "connection reset".
    request_queue_size = 128

    def __init__(self, engine: BatchingEngine, *, host: str = "127.0.0.1", port: int = 8000,
                 model_name: str = "memagent", default_max_tokens: int = 1024, verbose: bool = False,
                 api_key: str | None = None, max_body_bytes: int = 16 * 2**20, window: int | None = None) -> None:
        window = window or engine.window
        if window is None:
            raise ValueError("ChatServer: the model config has no max_position_embeddings; pass window")
        if max_body_bytes < 1:
            raise ValueError(f"ChatServer: max_body_bytes must be >= 1, got {max_body_bytes}")
        super().__init__((host, port), _Handler)
        self.engine, self.model_name, self.window = engine, model_name, window
        self.default_max_tokens, self.verbose, self.max_body_bytes = default_max_tokens, verbose, max_body_bytes
        self.api_key = api_key.encode("utf-8") if api_key else None
        self.url = f"http://{host}:{self.server_address[1]}/v1"
        self.draining = False
        """True once drain() began: new requests get 503."""
        self._in_flight = 0
        self._idle = threading.Condition()
        self._thread: threading.Thread | None = None

    def start_in_thread(self) -> threading.Thread:
        """Serve on a daemon thread (tests, notebooks); stop with close()."""
        self._thread = threading.Thread(target=self.serve_forever, name="memagent-serve-http", daemon=True)
        self._thread.start()
        return self._thread

    def drain(self, timeout_s: float | None = None) -> bool:
        """Refuse new requests (503) and wait for the in-flight ones; False if some were still running at timeout."""
        with self._idle:
            self.draining = True
            return self._idle.wait_for(lambda: self._in_flight == 0, timeout_s)

    def close(self) -> None:
        """Stop serving (when started with start_in_thread), release the port and stop the engine's worker."""
        if self._thread is not None:  # shutdown() waits for a serve_forever loop, so only call it when one runs
            self.shutdown()
            self._thread.join()
        self.server_close()
        self.engine.close()

    def authorized(self, header: str | None) -> bool:
        """Whether an Authorization header carries the key (always True without a key)."""
        if self.api_key is None:
            return True
        scheme, _, token = (header or "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode("utf-8"), self.api_key)

    @property
    def in_flight(self) -> int:
        """Requests being answered now."""
        return self._in_flight

    def enter(self) -> bool:
        """Count a request in flight; False (do not serve it) while draining."""
        with self._idle:
            if self.draining:
                return False
            self._in_flight += 1
            return True

    def leave(self) -> None:
        with self._idle:
            self._in_flight -= 1
            self._idle.notify_all()


class _Handler(BaseHTTPRequestHandler):
    server: ChatServer

    def do_GET(self) -> None:  # noqa: N802 (the http.server naming)
        self._serve(self._get)

    def do_POST(self) -> None:  # noqa: N802
        self._serve(self._post)

    def _serve(self, route: Callable[[], dict[str, Any]]) -> None:
        if not self.server.enter():
            self.close_connection = True
            return self._send_error(ApiError(503, "the server is shutting down", code="shutting_down",
                                             type="service_unavailable"))
        try:
            if not self.server.authorized(self.headers.get("Authorization")):
                raise ApiError(401, "missing or wrong API key (send 'Authorization: Bearer KEY')",
                               code="invalid_api_key", type="authentication_error")
            self._send(200, route())
        except ApiError as e:
            self._send_error(e)
        except Exception as e:  # noqa: BLE001 (our fault: answer 500 and keep serving)
            self._send_error(ApiError(500, f"{type(e).__name__}: {e}", type="server_error"))
        finally:
            self.server.leave()

    def _get(self) -> dict[str, Any]:
        if self.path.rstrip("/") != "/v1/models":
            raise ApiError(404, f"no route GET {self.path}", code="not_found")
        model = {"id": self.server.model_name, "object": "model", "created": 0, "owned_by": "memagent"}
        return {"object": "list", "data": [model]}

    def _post(self) -> dict[str, Any]:
        if self.path.rstrip("/") != "/v1/chat/completions":
            raise ApiError(404, f"no route POST {self.path}", code="not_found")
        try:
            length = body_length(self.headers, self.server.max_body_bytes)
        except ApiError:
            self.close_connection = True  # the body stays unread
            raise
        try:
            body = json.loads(self.rfile.read(length))
        except (ValueError, RecursionError) as e:  # json.JSONDecodeError and UnicodeDecodeError are ValueErrors
            raise ApiError(400, f"the body is not valid JSON: {e}", code="invalid_json") from e
        chat = parse_chat_body(body, self.server.engine.tokenizer, window=self.server.window,
                               default_max_tokens=self.server.default_max_tokens)
        try:
            completion = self.server.engine.submit(chat.request, chat.params, chat.seed)
        except RequestTimeout as e:
            raise ApiError(504, str(e), code="timeout", type="timeout_error") from e
        except RuntimeError as e:
            raise ApiError(500, str(e), type="server_error") from e
        return completion_body(completion, self.server.model_name)

    def _send_error(self, error: ApiError) -> None:
        self._send(error.status, error.body())

    def _send(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode("utf-8")
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if status == 401:
                self.send_header("WWW-Authenticate", "Bearer")
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):  # the client hung up; nobody is left to answer
            self.close_connection = True

    def log_message(self, format: str, *args: Any) -> None:
        if self.server.verbose:
            super().log_message(format, *args)
