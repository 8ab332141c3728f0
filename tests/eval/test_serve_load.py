"""memagent.serve under load and at its edges: concurrent good and bad clients, API key, body limit, shutdown."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from memagent.records import ChatRequest
from memagent.rollout.llm import LocalLLM
from memagent.rollout.prompts import user_message
from memagent.rollout.sampling import SamplingParams
from memagent.serve import BatchingEngine, ChatServer

GREEDY = SamplingParams(temperature=0.0)
KEY = "s3cret-key"
REPO = Path(__file__).resolve().parents[2]


def send(url: str, data: bytes, key: str | None = KEY, path: str = "/chat/completions") -> tuple[int, dict]:
    headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {key}"} if key else {})
    req = urllib.request.Request(url + path, data=data, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def chat(text: str, max_tokens: int, **extra) -> bytes:
    return json.dumps({"messages": [{"role": "user", "content": text}], "max_tokens": max_tokens,
                       "temperature": 0, **extra}).encode()


def test_concurrent_good_and_bad_clients_each_get_their_own_answer(tiny_model, tiny_tokenizer):
    srv = ChatServer(BatchingEngine(tiny_model, tiny_tokenizer, max_batch=16), port=0, api_key=KEY,
                     max_body_bytes=4096)
    srv.start_in_thread()
    good = [(f"load question {i}: the value of key {i * 13}?" + " pad" * (i % 5), 3 + i % 6) for i in range(16)]
    bad: list[tuple[bytes, str | None, int]] = [
        (chat("lone \udcff surrogate", 4), KEY, 400),
        (chat("x", 4).replace(b'"user"', b'"wizard"'), KEY, 400),
        (chat("x", -3), KEY, 400),
        (b"{broken", KEY, 400),
        (chat("y" * 5000, 4), KEY, 413),
        (chat("no key", 4), None, 401),
        (chat("wrong key", 4), "s3cret-kez", 401),
        (chat("x", 4, top_p=7), KEY, 400),
    ]
    jobs = [(chat(text, n), KEY, 200) for text, n in good]
    jobs[3:3], jobs[9:9], jobs[14:14] = bad[:3], bad[3:6], bad[6:]
    try:
        with ThreadPoolExecutor(16) as pool:
            replies = list(pool.map(lambda job: send(srv.url, job[0], job[1]), jobs))
        assert [status for status, _ in replies] == [expected for _, _, expected in jobs]
        local = LocalLLM(tiny_model, tiny_tokenizer, params=GREEDY).complete(
            [ChatRequest(user_message(text), max_new_tokens=n) for text, n in good])
        answered = [body["choices"][0]["message"]["content"] for (_, body), (_, _, s) in zip(replies, jobs) if s == 200]
        assert answered == [c.text for c in local]
        assert all(set(body["error"]) == {"message", "type", "param", "code"}
                   for (_, body), (_, _, s) in zip(replies, jobs) if s != 200)
        assert send(srv.url, chat("still there?", 2))[0] == 200
    finally:
        srv.close()


def test_models_route_needs_the_key_too(tiny_model, tiny_tokenizer):
    srv = ChatServer(BatchingEngine(tiny_model, tiny_tokenizer), port=0, api_key=KEY)
    srv.start_in_thread()
    try:
        for key, expected in ((None, 401), ("wrong", 401), (KEY, 200)):
            headers = {"Authorization": f"Bearer {key}"} if key else {}
            req = urllib.request.Request(srv.url + "/models", headers=headers)
            try:
                with urllib.request.urlopen(req, timeout=30) as r:
                    status = r.status
            except urllib.error.HTTPError as e:
                status = e.code
            assert status == expected
    finally:
        srv.close()


def test_draining_server_finishes_in_flight_request_and_refuses_new_ones_with_503(tiny_model, tiny_tokenizer):
    srv = ChatServer(BatchingEngine(tiny_model, tiny_tokenizer), port=0)
    srv.start_in_thread()
    first: list[tuple[int, dict]] = []
    client = threading.Thread(target=lambda: first.append(send(srv.url, chat("a long one", 200, seed=1), None)))
    try:
        client.start()
        while srv.in_flight == 0 and not first:
            threading.Event().wait(0.001)
        drained: list[bool] = []
        drainer = threading.Thread(target=lambda: drained.append(srv.drain(120)))
        drainer.start()
        while not srv.draining:
            threading.Event().wait(0.001)
        status, body = send(srv.url, chat("too late", 2), None)
        assert status == 503 and body["error"]["code"] == "shutting_down"
        client.join()
        drainer.join()
        assert first[0][0] == 200 and drained == [True]
    finally:
        srv.close()


def test_request_past_the_timeout_gets_504_and_the_server_keeps_serving(tiny_model, tiny_tokenizer):
    engine = BatchingEngine(tiny_model, tiny_tokenizer, timeout_s=1e-4)
    srv = ChatServer(engine, port=0)
    srv.start_in_thread()
    try:
        status, body = send(srv.url, chat("slow", 64), None)
        assert status == 504 and body["error"]["type"] == "timeout_error"
        engine.timeout_s = None
        assert send(srv.url, chat("fast", 2), None)[0] == 200
    finally:
        srv.close()


@pytest.mark.slow  # a fresh interpreter importing torch
def test_sigterm_stops_the_server_cleanly_and_the_key_comes_from_the_environment(tiny_model_dir):
    env = os.environ | {"MEMAGENT_API_KEY": KEY}
    proc = subprocess.Popen([sys.executable, "-m", "memagent.serve", "--model", str(tiny_model_dir), "--port", "0"],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        line = proc.stdout.readline()
        url = line.split(" at ")[1].split()[0]
        assert send(url, chat("hi", 2))[0] == 200
        assert send(url, chat("hi", 2), None)[0] == 401
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, err
    assert "stopped" in out
