"""One MemAgent rollout step: our engine with its rollout features added one at a time, and `model.generate`.

    OMP_NUM_THREADS=1 .venv/bin/python bench/rollout_memagent.py [--models tiny smollm2 --questions 2 --group 4
        --chunks 2 --chunk-tokens 512 --memory-tokens 64 --answer-tokens 16 --dtype float32 --clock cpu]

The work is shaped like the paper's: Q questions x G trajectories, K memory-update rounds plus the answer round.
Each round's prompts are the real workflow prompts (memory-update template + the question + the previous memory +
a chunk of a niah_single_1 document, through the chat template); responses are sampled at temperature 1 up to the
memory (or answer) budget with EOS on. In round 1 the G prompts of a group are identical (same question, initial
memory and chunk); later rounds differ by the memory each trajectory wrote, and agree up to it (template and
problem). Every engine gets exactly the same prompts: the memories that feed round k + 1 are ours from round k.

Engines, each adding one feature (memagent.rollout.generate flags):
  off     no prefill sharing, transformers' concatenating DynamicCache (the engine before issue 11)
  exact   + identical prompts prefilled once (share_prefill, min_shared_prefix=0)
  prefix  + common prefixes of 32+ tokens prefilled once (min_shared_prefix=32, memagent.rollout.prefill)
  on      + the KV cache written in place (preallocate_kv; memagent.rollout.kv_cache): the defaults
  hf      model.generate, same weights, same dtype, same sampling rule
Per round and engine: prefill = one call with max_new_tokens = 1; decode = a full call minus that prefill. With
EOS on, the engines sample different tokens, so decode is also reported per new token. `--clock cpu` (the
process's CPU time, one thread) is the figure to use on a machine shared with other jobs. Models: "tiny" (the
demo's tiny Qwen2, built into runs/bench/tiny if missing), "smollm2" (models/smollm2-135m-instruct, from
`make smollm2`; skipped with a message when absent) and "qwen2-0.5b" (a random Qwen2 with Qwen2.5-0.5B's decoder and
the tiny tokenizer, built into runs/bench/qwen2-0.5b-shape: the GPU check's model). `--section-first` renders the
update prompts section-first (workflow.section_first) for every engine alike: a group's prompts then share the
chunk too, which the "prefix" engine prefills once per group.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

from memagent.data import make_task  # noqa: E402
from memagent.model import build_tiny_model, load_model, load_tokenizer  # noqa: E402
from memagent.rollout.chunking import iter_chunks, tokenize_document  # noqa: E402
from memagent.rollout.llm import stop_token_ids  # noqa: E402
from memagent.rollout.prompts import render_final_answer, render_memory_update, user_message  # noqa: E402
from memagent.rollout.sampling import SamplingParams  # noqa: E402

engine = importlib.import_module("memagent.rollout.generate")
prefill = importlib.import_module("memagent.rollout.prefill")
SMOLLM2 = ROOT / "models" / "smollm2-135m-instruct"
TINY = ROOT / "runs" / "bench" / "tiny"
QWEN_0_5B = ROOT / "runs" / "bench" / "qwen2-0.5b-shape"
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
ENGINE_FLAGS = {
    "off": {"share_prefill": False, "min_shared_prefix": 0, "preallocate_kv": False},
    "exact": {"share_prefill": True, "min_shared_prefix": 0, "preallocate_kv": False},
    "prefix": {"share_prefill": True, "min_shared_prefix": 32, "preallocate_kv": False},
    "on": {"share_prefill": True, "min_shared_prefix": 32, "preallocate_kv": True},
}
ENGINES = (*ENGINE_FLAGS, "hf")


@dataclass
class RoundTiming:
    """Seconds and new tokens of one round for one engine."""

    prefill: float
    decode: float
    new_tokens: int


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["tiny", "smollm2"], choices=["tiny", "smollm2", "qwen2-0.5b"])
    parser.add_argument("--section-first", action="store_true",
                        help="the section-first update prompt (workflow.section_first), for every engine alike")
    parser.add_argument("--questions", type=int, default=2, help="Q questions")
    parser.add_argument("--group", type=int, default=4, help="G trajectories per question")
    parser.add_argument("--chunks", type=int, default=2, help="K memory-update rounds (document = K chunks)")
    parser.add_argument("--chunk-tokens", type=int, default=512)
    parser.add_argument("--memory-tokens", type=int, default=64)
    parser.add_argument("--answer-tokens", type=int, default=16)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--clock", choices=list(CLOCKS), default="wall")
    parser.add_argument("--device", default="cpu")
    return parser.parse_args(argv)


def model_dir(name: str) -> Path | None:
    if name == "smollm2":
        return SMOLLM2 if (SMOLLM2 / "config.json").is_file() else None
    if name == "qwen2-0.5b":  # Qwen2.5-0.5B's decoder (0.36B parameters) with the tiny tokenizer's 512 tokens
        if not (QWEN_0_5B / "config.json").is_file():
            build_tiny_model(QWEN_0_5B, hidden_size=896, num_layers=24, num_heads=14, num_kv_heads=2,
                             intermediate_size=4864, vocab_size=512, max_position_embeddings=32768)
        return QWEN_0_5B
    if not (TINY / "config.json").is_file():
        build_tiny_model(TINY, hidden_size=96, num_layers=3, intermediate_size=384, vocab_size=512)
    return TINY


def hf_generate(model, prompts: list[list[int]], max_new: int, eos: list[int], pad: int) -> list[int]:
    """model.generate on left-padded prompts at temperature 1, no truncation; returns new tokens per row."""
    device = next(model.parameters()).device
    ids, mask = prefill.left_pad(prompts, pad, device)
    out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                         max_new_tokens=max_new, pad_token_id=pad, eos_token_id=eos)
    new = out[:, ids.shape[1]:]
    return [int((row != pad).sum()) for row in new]


def time_round(fn, clock) -> float:
    t0 = clock()
    fn()
    return clock() - t0


def time_engines(model, prompts: list[list[int]], budget: int, eos: list[int], pad: int, gen: torch.Generator,
                 clock) -> tuple[dict[str, RoundTiming], object]:
    """Prefill (a 1-token call) and decode (full call minus prefill) of each engine on the same prompts.

    Engines: ENGINES (see the module docstring). Returns the timings and the "on" output."""
    params = SamplingParams()
    timings, out = {}, None
    for label in ENGINES:
        if label != "hf":
            flags = ENGINE_FLAGS[label]
            prefill = time_round(lambda flags=flags: engine.generate(
                model, prompts, max_new_tokens=1, eos_token_id=eos, params=params, generator=gen, pad_token_id=pad,
                **flags), clock)
            t0 = clock()
            out = engine.generate(model, prompts, max_new_tokens=budget, eos_token_id=eos, params=params,
                                  generator=gen, pad_token_id=pad, **flags)
            new = sum(len(x) for x in out.tokens)
        else:
            prefill = time_round(lambda: hf_generate(model, prompts, 1, eos, pad), clock)
            t0 = clock()
            new = sum(hf_generate(model, prompts, budget, eos, pad))
        total = clock() - t0
        timings[label] = RoundTiming(prefill, max(total - prefill, 0.0), new)
    return timings, out


def run_model(name: str, args: argparse.Namespace) -> None:
    path = model_dir(name)
    if path is None:
        print(f"{name}: skipped, {SMOLLM2} is missing (run `make smollm2`)")
        return
    clock = CLOCKS[args.clock]
    dtype = getattr(torch, args.dtype)
    tok = load_tokenizer(path)
    model = load_model(path, dtype=dtype, device=args.device).eval()
    eos = stop_token_ids(tok)
    pad = tok.pad_token_id if tok.pad_token_id is not None else eos[0]
    samples = make_task("niah_single_1", tok, length=args.chunks * args.chunk_tokens, num_samples=args.questions,
                        seed=0)
    chunks = [[c for c in iter_chunks(tokenize_document(s.context, tok), tok, args.chunk_tokens)] for s in samples]
    memories = ["No previous memory"] * (args.questions * args.group)

    def render(text: str) -> list[int]:
        return tok.apply_chat_template(list(user_message(text)), add_generation_prompt=True, tokenize=True,
                                       return_dict=False)

    gen = torch.Generator(args.device).manual_seed(0)
    print(f"\n{name} ({args.dtype}, {args.device}, clock {args.clock}, "
          f"{'section-first' if args.section_first else 'MemAgent order'}): Q={args.questions} G={args.group} "
          f"K={args.chunks} chunk={args.chunk_tokens} memory={args.memory_tokens} answer={args.answer_tokens}")
    print(f"{'round':<8} {'rows':>4} {'prompt':>6} | " + " | ".join(f"{e + ' prefill':>14} {'decode':>7} {'new':>5}"
                                                             for e in ENGINES) + f" | {'off/on':>6} {'HF/on':>6}")
    # Warm-up, untimed: the first forwards of a process pay for one-off allocations and kernel selection.
    engine.generate(model, [render(render_memory_update(samples[0].question, memories[0], chunks[0][0]))] * 2,
                    max_new_tokens=2, eos_token_id=eos, generator=gen, pad_token_id=pad, share_prefill=False)
    prefill = dict.fromkeys(ENGINES, 0.0)
    decode = {label: [0.0, 0] for label in ENGINES}  # seconds, new tokens
    with torch.inference_mode():
        for k in range(args.chunks + 1):
            last = k == args.chunks
            texts = [render_final_answer(s.question, memories[q * args.group + g]) if last else
                     render_memory_update(s.question, memories[q * args.group + g], chunks[q][min(k, len(chunks[q]) - 1)],
                                          section_first=args.section_first)
                     for q, s in enumerate(samples) for g in range(args.group)]
            prompts = [render(t) for t in texts]
            budget = args.answer_tokens if last else args.memory_tokens
            t, out = time_engines(model, prompts, budget, eos, pad, gen, clock)
            for label in ENGINES:
                prefill[label] += t[label].prefill
                decode[label][0] += t[label].decode
                decode[label][1] += t[label].new_tokens
            if not last:
                memories = [tok.decode(x, skip_special_tokens=True).strip() for x in out.tokens]
            total = {label: t[label].prefill + t[label].decode for label in ENGINES}
            print(f"{'answer' if last else f'chunk {k + 1}':<8} {len(prompts):>4} "
                  f"{sum(map(len, prompts)) / len(prompts):>6.0f} | "
                  + " | ".join(f"{t[e].prefill:>14.2f} {t[e].decode:>7.2f} {t[e].new_tokens:>5}" for e in ENGINES)
                  + f" | {total['off'] / total['on']:>5.2f}x {total['hf'] / total['on']:>5.2f}x")
    step = {label: prefill[label] + decode[label][0] for label in ENGINES}
    print("step seconds (prefill + decode): " + ", ".join(
        f"{label} {step[label]:.2f} ({prefill[label]:.2f} + {decode[label][0]:.2f})" for label in ENGINES))
    print("decode ms per new token: " + ", ".join(
        f"{label} {1000 * sec / max(n, 1):.1f}" for label, (sec, n) in decode.items()))
    print(f"step: off/on {step['off'] / step['on']:.2f}x, HF/on {step['hf'] / step['on']:.2f}x")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    print(f"threads={torch.get_num_threads()}")
    for name in args.models:
        run_model(name, args)


if __name__ == "__main__":
    main()
