"""Generation throughput: our KV-cache engine (`memagent.rollout.generate`) against Hugging Face `model.generate`.

    OMP_NUM_THREADS=2 .venv/bin/python bench/generate.py [--batches 16 64 --new-tokens 64 --top-p 0.9 --repeats 3]
    OMP_NUM_THREADS=1 .venv/bin/python bench/generate.py --clock cpu     # on a CPU other jobs are using

Models: random Qwen2s built from a config (`memagent.model.tiny.random_qwen2`), "tiny" (hidden 64, 2 layers,
vocab 512) and "h256" (hidden 256, 4 layers, vocab 32000). Prompts: random token ids of mixed lengths 8-32,
left-padded. Both engines sample with temperature 1.0, the same top-p, no top-k, EOS disabled, so every row makes
exactly --new-tokens tokens and the two do the same work. Timings are best of --repeats, the two engines alternating
in one process. Units: generated tok/s. --clock wall (default) is what a user waits; --clock cpu is this process's
CPU time (time.process_time), which other jobs on a shared, oversubscribed CPU barely disturb: use it there, with
OMP_NUM_THREADS=1 so that no thread spins waiting for a descheduled sibling.

Last, the share of a decode step spent in sampling at V = 32000, measured inside our engine's loop (the sampler is
wrapped with a timer for one run), for the benchmark's top-p and for plain softmax sampling (the rollout default).
`--samplers` instead times the sampler alone on [B, 32000] logits against the usual alternatives.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

from memagent.model.tiny import TinyModelConfig, random_qwen2  # noqa: E402
from memagent.rollout import sampling  # noqa: E402
from memagent.rollout.prefill import left_pad  # noqa: E402
from memagent.rollout.sampling import SamplingParams, sample_next_token  # noqa: E402

# The package re-exports the function `generate` under the submodule's name, so fetch the module itself.
engine = importlib.import_module("memagent.rollout.generate")

MODELS = {
    "tiny": TinyModelConfig(hidden_size=64, num_layers=2, intermediate_size=256, vocab_size=512),
    "h256": TinyModelConfig(hidden_size=256, num_layers=4, intermediate_size=1024, vocab_size=32000),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS), help="which models")
    parser.add_argument("--batches", nargs="+", type=int, default=[16, 64], help="batch sizes B")
    parser.add_argument("--new-tokens", type=int, default=64, help="tokens generated per row")
    parser.add_argument("--top-p", type=float, default=0.9, help="nucleus mass (top-k off, temperature 1)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per engine (best is reported)")
    parser.add_argument("--device", default="auto", help="cpu, cuda or auto (cuda when available)")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall", help="wall or process CPU time")
    parser.add_argument("--samplers", action="store_true", help="time the sampler alone against alternatives")
    return parser.parse_args(argv)


def make_prompts(batch: int, vocab: int, seed: int = 0) -> list[list[int]]:
    """B prompts of random ids with lengths drawn uniformly from 8..32."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(8, 33, (batch,), generator=g).tolist()
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lengths]


def hf_generate(model: torch.nn.Module, prompts: list[list[int]], new_tokens: int, top_p: float) -> None:
    """Hugging Face generate with the same sampling rule; the left padding is built the same way as ours."""
    device = next(model.parameters()).device
    ids, mask = left_pad(prompts, 0, device)
    model.generate(
        input_ids=ids,
        attention_mask=mask,
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=top_p,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        pad_token_id=0,
        eos_token_id=None,
    )


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
clock = CLOCKS["wall"]


def timed_call(fn: Callable[[], None], device: torch.device) -> float:
    """Seconds of one call on the chosen clock (CUDA: synchronized)."""
    t0 = clock()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return clock() - t0


def sampling_share(model: torch.nn.Module, prompts: list[list[int]], new_tokens: int, params: SamplingParams) -> float:
    """Fraction of our decode loop's time (prefill excluded) spent in sample_next_token, over one generate call."""
    inner, spent = engine.sample_next_token, [0.0]
    device = next(model.parameters()).device

    def timed(*args, **kwargs):
        t0 = clock()
        result = inner(*args, **kwargs)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        spent[0] += clock() - t0
        return result

    # The prefill is timed alone (one new token) and subtracted, so the share is of decode steps only.
    prefill = min(timed_call(lambda: engine.generate(model, prompts, max_new_tokens=1, eos_token_id=None,
                                                    params=params), device) for _ in range(2))
    engine.sample_next_token = timed
    try:
        total = timed_call(lambda: engine.generate(model, prompts, max_new_tokens=new_tokens, eos_token_id=None,
                                                  params=params, generator=torch.Generator(device).manual_seed(0)),
                          device)
    finally:
        engine.sample_next_token = inner
    return spent[0] / (total - prefill)


def compare(
    model: torch.nn.Module, prompts: list[list[int]], args: argparse.Namespace, params: SamplingParams,
    device: torch.device,
) -> tuple[float, float]:
    """Best seconds of our engine and of HF generate on the same prompts, runs alternating after a warm-up."""
    gen = torch.Generator(device).manual_seed(0)

    def ours() -> None:
        engine.generate(model, prompts, max_new_tokens=args.new_tokens, eos_token_id=None, params=params,
                        generator=gen)

    def theirs() -> None:
        hf_generate(model, prompts, args.new_tokens, args.top_p)

    ours(), theirs()
    t_ours, t_hf = float("inf"), float("inf")
    for _ in range(args.repeats):
        t_ours = min(t_ours, timed_call(ours, device))
        t_hf = min(t_hf, timed_call(theirs, device))
    return t_ours, t_hf


def compare_samplers(batches: list[int], top_p: float, repeats: int) -> None:
    """ms per call of our sampler and of the usual alternatives on random [B, 32000] logits (std 0.32, like h256)."""
    g = torch.Generator().manual_seed(0)

    def sort_top_p(x: torch.Tensor) -> None:  # our draw after a full-sort cut-off: what a sort-based top-p costs
        p = x.softmax(-1)
        cutoff = sampling._sorted_cutoff(p.sort(-1, descending=True).values, top_p)
        sampling._draw(torch.nn.functional.threshold(p.div_(cutoff), sampling._BELOW_ONE, 0.0), g)

    candidates: dict[str, Callable[[torch.Tensor], object]] = {
        "ours plain": lambda x: sample_next_token(x, SamplingParams(), g),
        "multinomial": lambda x: torch.multinomial(x.softmax(-1), 1, generator=g),
        "exp. race": lambda x: (x.softmax(-1) / torch.empty_like(x).exponential_(generator=g)).argmax(-1),
        "Gumbel-max": lambda x: (x - torch.rand(x.shape, generator=g).log_().neg_().log_()).argmax(-1),
        "topk(1024)": lambda x: x.topk(1024, -1),
        "full sort": lambda x: x.sort(-1),
        f"ours top-p {top_p:g}": lambda x: sample_next_token(x, SamplingParams(top_p=top_p), g),
        f"sort top-p {top_p:g}": sort_top_p,
    }
    print(f"sampler alone, [B, 32000] float32, ms per call (best of {repeats} x 10 calls, clock as chosen):")
    print(f"{'B':>4} " + " ".join(f"{name:>14}" for name in candidates))
    for batch in batches:
        x = torch.randn(batch, 32000, generator=g) * 0.32
        row = []
        for fn in candidates.values():

            def ten_calls(fn: Callable[[torch.Tensor], object] = fn, x: torch.Tensor = x) -> None:
                for _ in range(10):
                    fn(x)

            row.append(min(timed_call(ten_calls, x.device) for _ in range(repeats)) / 10)
        print(f"{batch:>4} " + " ".join(f"{1e3 * t:>14.2f}" for t in row))


def main(argv: list[str] | None = None) -> None:
    global clock
    args = parse_args(argv)
    clock = CLOCKS[args.clock]
    if args.samplers:
        compare_samplers(args.batches, args.top_p, args.repeats)
        return
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          "cpu" if args.device == "auto" else args.device)
    print(f"device={device} threads={torch.get_num_threads()} clock={args.clock} new_tokens={args.new_tokens} "
          f"top_p={args.top_p} (temperature 1, top-k off, EOS off; best of {args.repeats}; generated tok/s)")
    print(f"{'model':<6} {'B':>4} {'ours tok/s':>11} {'HF tok/s':>9} {'ours/HF':>8}")
    params = SamplingParams(top_p=args.top_p)
    for name in args.models:
        model = random_qwen2(MODELS[name]).to(device)
        model.generation_config.eos_token_id = None
        for batch in args.batches:
            t_ours, t_hf = compare(model, make_prompts(batch, MODELS[name].vocab_size), args, params, device)
            tokens = batch * args.new_tokens
            print(f"{name:<6} {batch:>4} {tokens / t_ours:>11.0f} {tokens / t_hf:>9.0f} {t_hf / t_ours:>7.2f}x")

    model = random_qwen2(MODELS["h256"]).to(device)
    print("share of a decode step spent in sampling, h256 (V = 32000), our engine:")
    for batch in args.batches:
        prompts = make_prompts(batch, 32000)
        for label, p in ((f"top_p={args.top_p:g}", params), ("plain (top_p=1)", SamplingParams())):
            share = min(sampling_share(model, prompts, args.new_tokens, p) for _ in range(args.repeats))
            print(f"  B={batch:<3} {label:<16} {100 * share:5.1f}%")


if __name__ == "__main__":
    main()
