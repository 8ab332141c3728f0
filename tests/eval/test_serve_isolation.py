"""One bad request never fails another: validation before batching, and a batch that fails is retried per request."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from memagent.records import ChatRequest
from memagent.rollout.llm import LocalLLM
from memagent.rollout.prompts import user_message
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


def test_batch_that_fails_is_retried_per_request_so_only_the_bad_one_errs(tiny_model, tiny_tokenizer):
    from memagent.server import complete_isolated

    good = [ChatRequest(user_message(f"question {i}"), max_new_tokens=5) for i in range(4)]
    unvalidated = ChatRequest(user_message("broken \udcff text"), max_new_tokens=5)  # what validation stops
    llm = LocalLLM(tiny_model, tiny_tokenizer, params=GREEDY)
    results = complete_isolated(llm, [*good[:2], unvalidated, *good[2:]])
    assert isinstance(results.pop(2), Exception)
    assert [r.text for r in results] == [c.text for c in llm.complete(good)]


@pytest.mark.parametrize(("body", "param"), [
    ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": "ok"}, {"role": "user", "content": 3}]}, "messages[1].content"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": True}, "max_tokens"),
    ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2.5}, "max_tokens"),
    ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": -1}, "max_tokens"),
    ({"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}, "temperature"),
    ({"messages": [{"role": "user", "content": "hi"}], "temperature": -1}, "temperature"),
    ({"messages": [{"role": "user", "content": "hi"}], "top_p": 0}, "top_p"),
    ({"messages": [{"role": "user", "content": "hi"}], "seed": 2**70}, "seed"),
    ({"messages": [{"role": "user", "content": "hi"}], "n": 2}, "n"),
    ({"messages": []}, "messages"),
])
def test_bad_field_gets_400_naming_it_in_an_openai_error_body(server, body, param):
    status, reply = post(server.url, body)
    assert status == 400
    assert reply["error"]["param"] == param
    assert reply["error"]["type"] == "invalid_request_error"
    assert set(reply["error"]) == {"message", "type", "param", "code"}


def test_huge_max_tokens_is_clamped_to_the_room_left_in_the_window(tiny_model, tiny_tokenizer):
    srv = ChatServer(BatchingEngine(tiny_model, tiny_tokenizer), port=0, window=64)
    srv.start_in_thread()
    try:
        status, reply = post(srv.url, chat("hello", 10**9))
        assert status == 200
        usage = reply["usage"]
        assert usage["total_tokens"] <= 64
        assert usage["prompt_tokens"] + usage["completion_tokens"] == usage["total_tokens"]
        status, reply = post(srv.url, chat("word " * 200))
        assert status == 400 and reply["error"]["code"] == "context_length_exceeded"
    finally:
        srv.close()


def test_malformed_bodies_keep_getting_clean_400s(server):
    for data in (b"", b"{not json", b"[1, 2]", b"\xff\xfe"):
        req = urllib.request.Request(server.url + "/chat/completions", data=data)
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(req, timeout=30)
        assert err.value.code == 400
        assert json.loads(err.value.read())["error"]["type"] == "invalid_request_error"


@pytest.fixture
def short_server(tiny_model, tiny_tokenizer) -> Iterator[ChatServer]:
    """A server whose default max_tokens is 5, so that a request leaving it to the default stays short."""
    srv = ChatServer(BatchingEngine(tiny_model, tiny_tokenizer), port=0, default_max_tokens=5)
    srv.start_in_thread()
    yield srv
    srv.close()


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens", "n", "temperature", "top_p", "seed",
                                   "stream"])
def test_null_optional_field_gets_the_same_answer_as_leaving_it_out(short_server, field):
    # OpenAI client libraries send null for every optional field the caller did not set.
    reference = {"messages": [{"role": "user", "content": "what is in the box?"}], "temperature": 0, "seed": 5}
    reference.pop(field, None)
    status, reply = post(short_server.url, reference | {field: None})
    assert status == 200, reply
    _, expected = post(short_server.url, reference)
    assert (reply["choices"], reply["usage"]) == (expected["choices"], expected["usage"])


def test_null_max_tokens_leaves_the_limit_to_max_completion_tokens(short_server):
    body = chat("count to ten") | {"max_tokens": None, "max_completion_tokens": 2}
    status, reply = post(short_server.url, body)
    assert status == 200, reply
    assert reply["usage"]["completion_tokens"] <= 2
