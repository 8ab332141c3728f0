"""One bad request never fails another: validation before batching, and a batch that fails is retried per request."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from memagent.rollout.llm import LocalLLM
from memagent.rollout.prompts import user_message
from memagent.rollout.records import ChatRequest
from memagent.rollout.sampling import SamplingParams
from memagent.serve import BatchingEngine, ChatServer

GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture
def server(tiny_model, tiny_tokenizer) -> Iterator[ChatServer]:
    srv = ChatServer(BatchingEngine(tiny_model, tiny_tokenizer, max_batch=16), host="127.0.0.1", port=0,
                     model_name="tiny")
    srv.start_in_thread()
    yield srv
    srv.close()


def post(url: str, body: dict) -> tuple[int, dict]:
    """POST one chat body (json.dumps escapes lone surrogates, as a client's JSON encoder does)."""
    req = urllib.request.Request(url + "/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def chat(text: str, max_tokens: int = 6) -> dict:
    return {"messages": [{"role": "user", "content": text}], "max_tokens": max_tokens, "temperature": 0}


def test_lone_surrogate_request_fails_alone_among_concurrent_good_requests(server, tiny_model, tiny_tokenizer):
    good = [chat(f"question {i}: where is key {i * 7}?") for i in range(11)]
    bad = chat("broken \udcff text")
    post(server.url, chat("warm up", 2))
    with ThreadPoolExecutor(12) as pool:
        replies = list(pool.map(lambda b: post(server.url, b), [*good[:5], bad, *good[5:]]))
    bad_status, bad_body = replies.pop(5)
    local = LocalLLM(tiny_model, tiny_tokenizer, params=GREEDY).complete(
        [ChatRequest(user_message(g["messages"][0]["content"]), max_new_tokens=6) for g in good])
    assert [status for status, _ in replies] == [200] * 11
    assert [body["choices"][0]["message"]["content"] for _, body in replies] == [c.text for c in local]
    assert bad_status == 400
    assert bad_body["error"]["param"] == "messages[0].content"
