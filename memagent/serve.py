"""Serve a local model through our own engine (LocalLLM) behind an OpenAI-compatible chat API.

    python -m memagent.serve --model DIR [--host 127.0.0.1 --port 8000 --api-key KEY]   (installed: memagent-serve)

Endpoints: POST /v1/chat/completions (messages, max_tokens, temperature, top_p, seed; null means the default; n must
be 1, no streaming) and GET /v1/models. It binds to loopback by default. With --api-key (or MEMAGENT_API_KEY) every
request needs "Authorization: Bearer KEY"; binding another address without a key prints a warning.

Every request is validated before it joins a batch (roles, UTF-8 text, numbers, prompt length within the window;
max_tokens is clamped to the room left), so one client's bad request is that client's 400 and never fails the
others; a batch that fails anyway is retried request by request (memagent.server). SIGTERM shuts down gracefully:
requests in flight finish, new ones get 503.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from pathlib import Path

from memagent.cli import run_cli
from memagent.server import LOOPBACK, BatchingEngine, ChatServer, completion_body, parse_chat_body

API_KEY_ENV = "MEMAGENT_API_KEY"
"""Environment variable read when --api-key is not given."""

__all__ = ["API_KEY_ENV", "BatchingEngine", "ChatServer", "completion_body", "main", "parse_chat_body"]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m memagent.serve",
                                description="Serve a local model with an OpenAI-compatible chat API.")
    p.add_argument("--model", required=True, help="HF model directory (config, weights, tokenizer)")
    p.add_argument("--host", default="127.0.0.1", help="bind address; loopback by default")
    p.add_argument("--port", type=int, default=8000, help="port; 0 picks a free one")
    p.add_argument("--api-key", default=None, help=f"require 'Authorization: Bearer KEY' (default: ${API_KEY_ENV})")
    p.add_argument("--name", default=None, help="model name reported by the API (default: the dir name)")
    p.add_argument("--max-batch", type=int, default=32, help="most requests generated together")
    p.add_argument("--default-max-tokens", type=int, default=1024, help="max_tokens when a request omits it")
    p.add_argument("--max-body-bytes", type=int, default=16 * 2**20, help="larger request bodies get 413")
    p.add_argument("--request-timeout", type=float, default=600.0, help="seconds before a request gets 504")
    p.add_argument("--kv-cache-budget-gb", type=float, default=0.0,
                   help="GiB of KV cache one generate call may hold; a prompt that cannot fit gets a 400 (0 = none)")
    p.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    p.add_argument("--dtype", default=None,
                   help="float32 (default), bfloat16, float16 or auto (bfloat16 where bf16 matmuls are native)")
    p.add_argument("--seed", type=int, default=0, help="seed of the generator shared by unseeded requests")
    p.add_argument("--verbose", action="store_true", help="log every HTTP request")
    args = p.parse_args(argv)
    for flag in ("max_batch", "default_max_tokens", "max_body_bytes"):
        if getattr(args, flag) < 1:
            p.error(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    if args.request_timeout <= 0:
        p.error(f"--request-timeout must be > 0, got {args.request_timeout}")
    if args.kv_cache_budget_gb < 0:
        p.error(f"--kv-cache-budget-gb must be >= 0 (0 = none), got {args.kv_cache_budget_gb}")
    args.api_key = args.api_key or os.environ.get(API_KEY_ENV) or None
    if args.api_key is None and args.host not in LOOPBACK:
        print(f"warning: serving on {args.host} without an API key: anyone who can reach this port can run the "
              f"model; pass --api-key KEY or set {API_KEY_ENV}", file=sys.stderr, flush=True)
    if not Path(args.model).is_dir():
        p.error(f"--model {args.model}: no such directory")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from memagent.model import load_model, load_tokenizer  # after parsing: --help and flag errors stay fast

    model = load_model(args.model, dtype=args.dtype, device=args.device).eval()
    tokenizer = load_tokenizer(args.model)
    engine = BatchingEngine(model, tokenizer, max_batch=args.max_batch, seed=args.seed,
                            timeout_s=args.request_timeout, kv_cache_budget_bytes=args.kv_cache_budget_gb * 2**30)
    server = ChatServer(engine, host=args.host, port=args.port, model_name=args.name or Path(args.model).name,
                        default_max_tokens=args.default_max_tokens, verbose=args.verbose, api_key=args.api_key,
                        max_body_bytes=args.max_body_bytes)

    def stop_gracefully() -> None:
        server.drain(args.request_timeout)
        server.shutdown()

    # serve_forever runs on this thread, so the handler hands the shutdown to another one.
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=stop_gracefully, daemon=True).start())
    print(f"serving {args.model} at {server.url} (Ctrl-C or SIGTERM to stop)", flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()
        engine.close()
    print("stopped: in-flight requests answered", flush=True)
    return 0


def cli() -> None:
    """`memagent-serve` and `python -m memagent.serve`: main() with one-line user errors."""
    run_cli(main)


if __name__ == "__main__":
    cli()
