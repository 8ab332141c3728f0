"""The server keeps generation within its KV-cache budget: calls sized by the budget, max_tokens clamped to the room
a prompt leaves, and a 400 naming the limit when a prompt alone does not fit (issue 23)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from transformers import PreTrainedModel

from memagent.model.shape import row_bytes, shape_from_config
from memagent.rollout.kv_cache import cache_bytes
from memagent.serve import BatchingEngine, ChatServer

ROW_TOKENS = 240
"""The budget: one row of this many tokens (prompt + max_tokens), the most one request may hold."""


def budget_of(model: PreTrainedModel) -> float:
    return row_bytes(shape_from_config(model.config.to_dict()), ROW_TOKENS, 0, dtype_bytes=4)


@pytest.fixture
def peak_cache_bytes(tiny_model) -> Iterator[list[int]]:
    """[the most bytes a generate call's KV cache held after any forward], filled as the server generates."""
    peak = [0]

    def measure(_module, _args, kwargs, _output) -> None:
        peak[0] = max(peak[0], cache_bytes(kwargs["cache"]))

    handle = tiny_model.register_forward_hook(measure, with_kwargs=True)
    yield peak
    handle.remove()


@pytest.fixture
def server(tiny_model, tiny_tokenizer) -> Iterator[ChatServer]:
    engine = BatchingEngine(tiny_model, tiny_tokenizer, max_batch=16,
                            kv_cache_budget_bytes=budget_of(tiny_model))
    srv = ChatServer(engine, host="127.0.0.1", port=0, model_name="tiny")
    srv.start_in_thread()
    yield srv
    srv.close()


def post(url: str, text: str, max_tokens: int) -> tuple[int, dict]:
    body = {"messages": [{"role": "user", "content": text}], "max_tokens": max_tokens, "temperature": 0}
    req = urllib.request.Request(url + "/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_the_budget_holds_one_request_of_row_tokens(server):
    assert server.engine.row_tokens == ROW_TOKENS


def test_a_prompt_that_alone_exceeds_the_kv_budget_gets_a_400_naming_the_limit(server):
    status, body = post(server.url, "where is the key of the blue door? " * 40, 8)
    assert status == 400
    assert body["error"]["code"] == "kv_cache_budget_exceeded"
    assert body["error"]["param"] == "messages"
    assert f"holds {ROW_TOKENS} tokens per request" in body["error"]["message"]
    status, body = post(server.url, "where is the key?", 8)  # the server goes on serving
    assert status == 200


def test_concurrent_requests_of_any_max_tokens_keep_the_cache_within_the_budget(server, tiny_model, peak_cache_bytes):
    """Twelve clients, some asking for 50000 tokens: before, one call held every row at prompt + 50000."""
    asks = [(f"question {i}: where is key {i * 7}?" + " and more" * (i % 4), [4, 50000, 300][i % 3])
            for i in range(12)]
    with ThreadPoolExecutor(12) as pool:
        replies = list(pool.map(lambda ask: post(server.url, *ask), asks))
    assert [status for status, _ in replies] == [200] * 12
    for (_, max_tokens), (_, body) in zip(asks, replies):
        usage = body["usage"]
        assert usage["completion_tokens"] <= min(max_tokens, ROW_TOKENS - usage["prompt_tokens"])
    assert 0 < peak_cache_bytes[0] <= budget_of(tiny_model)


def test_the_command_line_budgets_of_serve_and_evaluate_reach_their_engines(tiny_model_dir) -> None:
    import argparse

    from memagent.evaluation.model_choice import add_model_args, build_evaluated_model
    from memagent.serve import parse_args

    assert parse_args(["--model", str(tiny_model_dir), "--kv-cache-budget-gb", "0.5"]).kv_cache_budget_gb == 0.5
    with pytest.raises(SystemExit):
        parse_args(["--model", str(tiny_model_dir), "--kv-cache-budget-gb", "-1"])
    parser = argparse.ArgumentParser()
    add_model_args(parser)
    args = parser.parse_args(["--model", str(tiny_model_dir), "--kv-cache-budget-gb", "0.25"])
    assert build_evaluated_model(args).llm.kv_cache_budget_bytes == 0.25 * 2**30
