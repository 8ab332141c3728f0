"""The OpenAI-compatible client (memagent.rollout.api_llm) against our real local server (memagent.serve)."""

from __future__ import annotations

import json
import socket
import urllib.request
from collections.abc import Iterator

import pytest

from memagent.records import ChatRequest
from memagent.rollout.api_llm import OpenAIChatLLM
from memagent.rollout.llm import LocalLLM
from memagent.rollout.prompts import user_message
from memagent.rollout.sampling import SamplingParams
from memagent.serve import BatchingEngine, ChatServer

GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture
def server(tiny_model, tiny_tokenizer) -> Iterator[ChatServer]:
    engine = BatchingEngine(tiny_model, tiny_tokenizer, max_batch=16)
    srv = ChatServer(engine, host="127.0.0.1", port=0, model_name="tiny")
    srv.start_in_thread()
    yield srv
    srv.close()


def _requests(n: int) -> list[ChatRequest]:
    return [ChatRequest(user_message(f"question {i}: where is key {i * 7}?" + " more" * i), max_new_tokens=4 + 3 * i)
            for i in range(n)]


def _dead_port() -> int:
    """A port nothing listens on: bind, read the number, close."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_api_client_against_server_matches_in_process_engine_under_greedy(server, tiny_model, tiny_tokenizer):
    requests = _requests(8)
    client = OpenAIChatLLM(server.url, "", "tiny", temperature=0.0, top_p=1.0, concurrency=8, retries=0, timeout=60)
    remote = client.complete(requests)
    local = LocalLLM(tiny_model, tiny_tokenizer, params=GREEDY).complete(requests)
    assert [c.error for c in remote] == [None] * len(requests)
    assert [c.text for c in remote] == [c.text for c in local]
    assert [c.finished for c in remote] == [c.finished for c in local]
    assert sum(server.engine.batches) == len(requests)


def test_server_batches_concurrent_requests_into_shared_generate_calls(server):
    client = OpenAIChatLLM(server.url, "", "tiny", temperature=0.0, top_p=1.0, concurrency=8, retries=0)
    client.complete([ChatRequest(user_message("warm up"), max_new_tokens=2)])
    server.engine.batches.clear()
    client.complete(_requests(8))
    assert sum(server.engine.batches) == 8
    assert len(server.engine.batches) < 8  # eight requests arrive within one generate call's time


def test_server_lists_its_model_and_reports_usage(server):
    with urllib.request.urlopen(server.url + "/models", timeout=10) as r:
        models = json.loads(r.read())
    assert [m["id"] for m in models["data"]] == ["tiny"]
    body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0}).encode()
    req = urllib.request.Request(server.url + "/chat/completions", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        reply = json.loads(r.read())
    assert reply["choices"][0]["finish_reason"] in ("stop", "length")
    assert 1 <= reply["usage"]["completion_tokens"] <= 3


def test_dead_port_gives_error_completion_after_bounded_retries():
    client = OpenAIChatLLM(f"http://127.0.0.1:{_dead_port()}/v1", "", "m", temperature=0.0, top_p=1.0,
                           retries=2, timeout=2, backoff=0.01)
    [completion] = client.complete([ChatRequest(user_message("hello"), max_new_tokens=4)])
    assert completion.text == "" and not completion.finished
    assert completion.error is not None and "after 3 attempt(s)" in completion.error


def test_client_error_is_not_retried(server):
    client = OpenAIChatLLM(server.url, "", "tiny", temperature=0.0, top_p=1.0, retries=3, backoff=0.01)
    [completion] = client.complete([ChatRequest(user_message("hello"), max_new_tokens=0)])
    assert completion.error is not None
    assert "HTTP 400" in completion.error and "after 1 attempt(s)" in completion.error


def test_server_errors_are_retried_until_the_request_succeeds():
    from http.server import BaseHTTPRequestHandler, HTTPServer
    from threading import Thread

    hits = []

    class Flaky(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            self.rfile.read(int(self.headers["Content-Length"]))
            hits.append(1)
            status = 503 if len(hits) <= 2 else 200
            body = json.dumps({"choices": [{"message": {"content": "ok"}, "finish_reason": "length"}]}).encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    flaky = HTTPServer(("127.0.0.1", 0), Flaky)
    Thread(target=flaky.serve_forever, daemon=True).start()
    try:
        client = OpenAIChatLLM(f"http://127.0.0.1:{flaky.server_address[1]}/v1", "k", "m", temperature=0.0,
                               top_p=1.0, retries=3, backoff=0.01, timeout=10)
        [completion] = client.complete([ChatRequest(user_message("hi"), max_new_tokens=2)])
    finally:
        flaky.shutdown()
        flaky.server_close()
    assert (completion.text, completion.error, completion.finished, len(hits)) == ("ok", None, False, 3)
