"""Command-line choice of the LLM evaluated shared by evaluate.py and memagent.ask: a local model or an HTTP API.

Local: `--model DIR` loads the weights and runs our engine (LocalLLM). Online: `--api-base URL --api-model NAME
[--api-key KEY]` drives any OpenAI-compatible endpoint (OpenAIChatLLM); the workflow still needs the served
model's tokenizer locally, because documents are chunked in the policy's tokens: `--tokenizer DIR` (or `--model
DIR`, whose tokenizer is then used and whose weights are not loaded). `--model DIR --adapter FILE` evaluates a
LoRA policy kept as its adapters alone: the base at DIR with the adapter file folded in.

Sampling defaults are MemAgent's offline evaluation (temperature 0.7, top_p 0.95); `--greedy` sets temperature 0.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerBase

from memagent.rollout.api_llm import OpenAIChatLLM
from memagent.rollout.llm import LLM, LocalLLM
from memagent.rollout.sampling import SamplingParams


def add_model_args(parser: argparse.ArgumentParser) -> None:
    """Add the model/evaluated and sampling flags."""
    g = parser.add_argument_group("model and evaluated")
    g.add_argument("--model", help="local HF model directory (weights + tokenizer)")
    g.add_argument("--adapter", help="a LoRA adapter file (a LoRA run's adapter.safetensors) folded into --model's "
                                     "weights at load: the policy a LoRA run trained on that base")
    g.add_argument("--api-base", help="OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1 (no weights loaded)")
    g.add_argument("--api-key", default="", help="Bearer token for --api-base ('' sends none)")
    g.add_argument("--api-model", help="model name at --api-base")
    g.add_argument("--tokenizer", help="tokenizer directory for --api-base (default: --model)")
    g.add_argument("--concurrency", type=int, default=8, help="HTTP requests in flight (--api-base)")
    g.add_argument("--retries", type=int, default=3, help="retries per HTTP request after the first try")
    g.add_argument("--timeout", type=float, default=600.0, help="seconds per HTTP attempt")
    g.add_argument("--backoff", type=float, default=1.0, help="first retry delay in seconds (doubles each retry)")
    g.add_argument("--device", default=None, help="torch device for --model (default: cuda if available)")
    g.add_argument("--dtype", default=None,
                   help="float32 (default), bfloat16, float16 or auto (bfloat16 where bf16 matmuls are native); "
                        "evaluate.py records the resolved one and resumes a directory only in it")
    g.add_argument("--kv-cache-budget-gb", type=float, default=0.0,
                   help="GiB of KV cache one generate call may hold for --model; calls are cut to fit (0 = none)")
    s = parser.add_argument_group("sampling (MemAgent's evaluation defaults)")
    s.add_argument("--temperature", type=float, default=0.7)
    s.add_argument("--top-p", type=float, default=0.95)
    s.add_argument("--greedy", action="store_true", help="temperature 0 (deterministic answers)")
    s.add_argument("--seed", type=int, default=0, help="sampling seed")


@dataclass(frozen=True)
class EvaluatedModel:
    """A ready LLM plus what the entry points need to know about it."""

    llm: LLM
    """The evaluated; llm.tokenizer is the policy tokenizer."""
    tokenizer: PreTrainedTokenizerBase
    """Same object as llm.tokenizer."""
    name: str
    """Model directory or API model name (for logs and results)."""
    window: int | None
    """The model's context window (config max_position_embeddings), None when unknown."""
    temperature: float
    """Sampling temperature actually used (0 with --greedy)."""
    top_p: float
    """Nucleus mass actually used."""
    dtype: str | None
    """The local weights' (and so the arithmetic's) dtype, e.g. "float32" once `--dtype auto` resolved; None for
    an API model."""


def build_evaluated_model(args: argparse.Namespace) -> EvaluatedModel:
    """Load the local model or connect the API client, per the flags of `add_model_args`."""
    from memagent.model import load_model, load_tokenizer
    from memagent.model.precision import dtype_name

    temperature = 0.0 if args.greedy else args.temperature
    top_p = 1.0 if args.greedy else args.top_p
    if args.api_base:
        if args.adapter:
            raise SystemExit("--adapter folds into local weights (--model DIR); an API model is served as it is")
        if not args.api_model:
            raise SystemExit("--api-base needs --api-model (the model name the server expects)")
        tokenizer_dir = args.tokenizer or args.model
        if not tokenizer_dir:
            raise SystemExit("--api-base needs --tokenizer DIR (or --model DIR): chunks are counted in its tokens")
        tokenizer = load_tokenizer(tokenizer_dir)
        llm = OpenAIChatLLM(args.api_base, args.api_key, args.api_model, temperature=temperature, top_p=top_p,
                            tokenizer=tokenizer, seed=args.seed, concurrency=args.concurrency,
                            retries=args.retries, timeout=args.timeout,
                            backoff=args.backoff)
        return EvaluatedModel(llm, tokenizer, args.api_model, config_window(tokenizer_dir), temperature, top_p,
                              dtype=None)
    if not args.model:
        raise SystemExit("pass --model DIR (a local model) or --api-base URL --api-model NAME (an online one)")
    if args.adapter:
        model = adapted_model(args.model, args.adapter, dtype=args.dtype, device=args.device).eval()
    else:
        model = load_model(args.model, dtype=args.dtype, device=args.device).eval()
    tokenizer = load_tokenizer(args.model)
    first = next(model.parameters())
    device = first.device
    generator = torch.Generator(device=device).manual_seed(args.seed)
    llm = LocalLLM(model, tokenizer, params=SamplingParams(temperature=temperature, top_p=top_p),
                   generator=generator, kv_cache_budget_bytes=args.kv_cache_budget_gb * 2**30)
    name = f"{args.model} + {args.adapter}" if args.adapter else str(args.model)
    return EvaluatedModel(llm, tokenizer, name, config_window(args.model), temperature, top_p,
                          dtype=dtype_name(first.dtype))


def adapted_model(base: str | Path, adapter: str | Path, *, dtype: str | None, device: str | None) -> torch.nn.Module:
    """The base model at `base` with the LoRA adapter file folded in, in `dtype` on `device`.

    The merge runs in float32, W + (alpha / r) B A as a LoRA run saves its merged `model/` (bit for bit on one
    machine), and the result is cast to `dtype` after: merging into a bf16 base would round most of a small update
    away (memagent.model.lora's `rounding_loss`)."""
    from memagent.model import load_model
    from memagent.model.loading import resolve_device, resolve_dtype
    from memagent.model.lora import merge_adapter_file

    if not Path(adapter).is_file():
        raise SystemExit(f"--adapter {adapter}: no such file")
    target = resolve_dtype(dtype, resolve_device(device))
    model = load_model(base, dtype=torch.float32, device=device)
    try:
        merge_adapter_file(model, adapter)
    except ValueError as e:
        raise SystemExit(f"--adapter {adapter} does not fit --model {base}: {e}") from e
    return model.to(target)


def config_window(directory: str | Path) -> int | None:
    """max_position_embeddings from a model directory's config.json, or None when there is none."""
    path = Path(directory) / "config.json"
    if not path.exists():
        return None
    config = json.loads(path.read_text())
    window = config.get("max_position_embeddings") or config.get("text_config", {}).get("max_position_embeddings")
    return int(window) if window else None
