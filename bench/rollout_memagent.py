"""One MemAgent rollout step: our engine with shared prefill off and on, and Hugging Face `model.generate`.

    OMP_NUM_THREADS=2 .venv/bin/python bench/rollout_memagent.py [--models tiny smollm2 --questions 2 --group 4
        --chunks 2 --chunk-tokens 512 --memory-tokens 64 --answer-tokens 16 --dtype float32 --clock wall]

The work is shaped like the paper's: Q questions x G trajectories, K memory-update rounds plus the answer round.
Each round's prompts are the real workflow prompts (memory-update template + the question + the previous memory +
a chunk of a niah_single_1 document, through the chat template); responses are sampled at temperature 1 up to the
memory (or answer) budget with EOS on. In round 1 the G prompts of a group are identical (same question, initial
memory and chunk); later rounds differ by the memory each trajectory wrote. Both engines get exactly the same
prompts: the memories that feed round k + 1 are ours from round k.

Per round and engine: prefill = one call with max_new_tokens = 1; decode = a full call minus that prefill. With
EOS on, the engines sample different tokens, so the new-token counts are printed beside the times. "ours" runs
three times per round: "off" (no shared prefill, transformers' concatenating DynamicCache: the engine before
issue 11), "share" (shared prefill) and "on" (shared prefill + the in-place KV cache, the defaults); the memories of
the next round are from "on".

Common-prefix sharing (not in the engine; measured here to decide whether it pays). The G prompts of a later round
share their text up to the memory (chat-template system prompt, instruction, problem). Per round: "lcp" = mean
common token prefix of a group's prompts, "save" = the fraction of the round's prefill tokens a prefix share would
skip, sum over groups of (G - 1) * lcp / all prompt tokens. "full" and "prefix" time two bare prefill forwards
(no sampling) of the same prompts: the whole left-padded batch through the cache, and a prototype that prefills
each group's prefix once, copies its cache G times and prefills the suffixes behind it (middle padding,
[pads][prefix][pads][suffix], positions = cumsum(mask) - 1); its last-position logits are checked against the full
prefill's. Round 1 shows "-": its prompts are identical and exact sharing already prefills them once. Models: "tiny"
(the demo's tiny Qwen2, built into runs/bench/tiny if missing) and "smollm2" (models/smollm2-135m-instruct, from
`make smollm2`; skipped with a message when absent). Both engines run the same weights in the same dtype.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import DynamicCache

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
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


@dataclass
class RoundTiming:
    """Seconds and new tokens of one round for one engine."""

    prefill: float
    decode: float
    new_tokens: int


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["tiny", "smollm2"], choices=["tiny", "smollm2"])
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

    Engines: "off" = ours as it was (no shared prefill, transformers' concatenating DynamicCache), "share" = shared
    prefill, "on" = shared prefill and the in-place KV cache (the defaults), "hf" = model.generate. Returns the
    timings and the "on" output."""
    params = SamplingParams()
    timings, out = {}, None
    for label in ("off", "share", "on", "hf"):
        if label != "hf":
            engine_flags = {"share_prefill": label != "off", "preallocate_kv": label == "on"}
            prefill = time_round(lambda flags=engine_flags: engine.generate(
                model, prompts, max_new_tokens=1, eos_token_id=eos, params=params, generator=gen, pad_token_id=pad,
                **flags), clock)
            t0 = clock()
            out = engine.generate(model, prompts, max_new_tokens=budget, eos_token_id=eos, params=params,
                                  generator=gen, pad_token_id=pad, **engine_flags)
            new = sum(len(x) for x in out.tokens)
        else:
            prefill = time_round(lambda: hf_generate(model, prompts, 1, eos, pad), clock)
            t0 = clock()
            new = sum(hf_generate(model, prompts, budget, eos, pad))
        total = clock() - t0
        timings[label] = RoundTiming(prefill, max(total - prefill, 0.0), new)
    return timings, out


def common_prefix(rows: list[list[int]]) -> int:
    """Length of the longest token prefix shared by all rows."""
    n = min(map(len, rows))
    for i in range(n):
        if any(r[i] != rows[0][i] for r in rows[1:]):
            return i
    return n


@torch.inference_mode()
def full_prefill(model, prompts: list[list[int]], pad: int) -> torch.Tensor:
    """Last-position logits [B, V] of a plain left-padded prefill through a fresh cache (the engine's own)."""
    ids, mask = prefill.left_pad(prompts, pad, next(model.parameters()).device)
    positions = (mask.cumsum(-1) - 1).clamp_(min=0)
    return prefill.forward_through_cache(model, ids, mask, positions, DynamicCache(config=model.config), 0)


@torch.inference_mode()
def prefix_shared_prefill(model, prompts: list[list[int]], group: int, pad: int) -> torch.Tensor:
    """The prototype: each group's common prefix prefilled once, its cache copied G times, then the suffixes.

    prompts: Q * G rows, each group's G contiguous. Every suffix keeps at least one token, so that every row has a
    last position. Returns last-position logits [Q * G, V].
    """
    device = next(model.parameters()).device
    groups = [prompts[i:i + group] for i in range(0, len(prompts), group)]
    lcps = [min(common_prefix(g), min(map(len, g)) - 1) for g in groups]
    ids, prefix_mask = prefill.left_pad([g[0][:n] for g, n in zip(groups, lcps)], pad, device)
    cache = DynamicCache(config=model.config)
    prefill.forward_through_cache(model, ids, prefix_mask, (prefix_mask.cumsum(-1) - 1).clamp_(min=0), cache, 0)
    expand = torch.arange(len(groups), device=device).repeat_interleave(group)
    cache.reorder_cache(expand)
    suffix_ids, suffix_mask = prefill.left_pad([p[n:] for g, n in zip(groups, lcps) for p in g], pad, device)
    mask = torch.cat([prefix_mask.index_select(0, expand), suffix_mask], dim=1)  # [pads][prefix][pads][suffix]
    positions = (mask.cumsum(-1) - 1).clamp_(min=0)[:, ids.shape[1]:]
    return model(input_ids=suffix_ids, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True,
                 logits_to_keep=1).logits[:, -1, :]


@dataclass
class PrefixShare:
    """What a common-prefix share would do to one round's prefill."""

    lcp: float
    """Mean common prefix of a group's prompts, tokens."""
    saved: float
    """Fraction of the round's prompt tokens it would not prefill."""
    full: float
    """Seconds of the plain prefill forward."""
    prefix: float
    """Seconds of the prototype's forwards."""
    max_diff: float
    """Largest |logit difference| between the two, a correctness check of the prototype."""


def measure_prefix_share(model, prompts: list[list[int]], group: int, pad: int, clock) -> PrefixShare:
    groups = [prompts[i:i + group] for i in range(0, len(prompts), group)]
    lcps = [common_prefix(g) for g in groups]
    saved = sum((group - 1) * n for n in lcps) / sum(map(len, prompts))
    t0 = clock()
    reference = full_prefill(model, prompts, pad)
    t1 = clock()
    shared = prefix_shared_prefill(model, prompts, group, pad)
    t2 = clock()
    diff = float((reference.float() - shared.float()).abs().max())
    return PrefixShare(sum(lcps) / len(lcps), saved, t1 - t0, t2 - t1, diff)


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
    print(f"\n{name} ({args.dtype}, {args.device}, clock {args.clock}): Q={args.questions} G={args.group} "
          f"K={args.chunks} chunk={args.chunk_tokens} memory={args.memory_tokens} answer={args.answer_tokens}")
    print(f"{'round':<8} {'rows':>4} {'prompt':>6} | {'off prefill':>11} {'decode':>7} {'new':>5} | "
          f"{'share decode':>12} {'new':>5} | {'on prefill':>10} {'decode':>7} {'new':>5} | {'HF prefill':>10} {'decode':>7} {'new':>5} | "
          f"{'pre off/on':>10} {'HF/on':>6} | {'lcp':>5} {'save':>5} {'full':>6} {'prefix':>6} {'diff':>7}")
    # Warm-up, untimed: the first forwards of a process pay for one-off allocations and kernel selection.
    engine.generate(model, [render(render_memory_update(samples[0].question, memories[0], chunks[0][0]))] * 2,
                    max_new_tokens=2, eos_token_id=eos, generator=gen, pad_token_id=pad, share_prefill=False)
    totals = {"off": 0.0, "share": 0.0, "on": 0.0, "hf": 0.0, "prefill off": 0.0, "prefill on": 0.0,
              "prefix gain": 0.0}
    decode = {label: [0.0, 0] for label in ("off", "share", "on", "hf")}  # seconds, new tokens
    with torch.inference_mode():
        for k in range(args.chunks + 1):
            last = k == args.chunks
            texts = [render_final_answer(s.question, memories[q * args.group + g]) if last else
                     render_memory_update(s.question, memories[q * args.group + g], chunks[q][min(k, len(chunks[q]) - 1)])
                     for q, s in enumerate(samples) for g in range(args.group)]
            prompts = [render(t) for t in texts]
            budget = args.answer_tokens if last else args.memory_tokens

            t, out = time_engines(model, prompts, budget, eos, pad, gen, clock)
            for label in ("off", "share", "on", "hf"):
                totals[label] += t[label].prefill + t[label].decode
                decode[label][0] += t[label].decode
                decode[label][1] += t[label].new_tokens
            totals["prefill off"] += t["off"].prefill
            totals["prefill on"] += t["on"].prefill
            share = None if k == 0 else measure_prefix_share(model, prompts, args.group, pad, clock)
            if share is not None:
                totals["prefix gain"] += share.full - share.prefix
            if not last:
                memories = [tok.decode(x, skip_special_tokens=True).strip() for x in out.tokens]
            mean_prompt = sum(map(len, prompts)) / len(prompts)
            f, sh, o, h = t["off"], t["share"], t["on"], t["hf"]
            prefix_cols = ("-" * 5 + " " + "-" * 5 + " " + "-" * 6 + " " + "-" * 6 + " " + "-" * 7 if share is None else
                           f"{share.lcp:>5.0f} {share.saved:>5.1%} {share.full:>6.2f} {share.prefix:>6.2f} "
                           f"{share.max_diff:>7.1e}")
            print(f"{'answer' if last else f'chunk {k + 1}':<8} {len(prompts):>4} {mean_prompt:>6.0f} | "
                  f"{f.prefill:>11.2f} {f.decode:>7.2f} {f.new_tokens:>5} | {sh.decode:>12.2f} {sh.new_tokens:>5} | "
                  f"{o.prefill:>10.2f} {o.decode:>7.2f} "
                  f"{o.new_tokens:>5} | {h.prefill:>10.2f} {h.decode:>7.2f} {h.new_tokens:>5} | "
                  f"{f.prefill / max(o.prefill, 1e-9):>9.2f}x {(h.prefill + h.decode) / max(o.prefill + o.decode, 1e-9):>5.2f}x | "
                  f"{prefix_cols}")
    print("decode ms per new token: " + ", ".join(
        f"{label} {1000 * sec / max(n, 1):.1f}" for label, (sec, n) in decode.items()))
    print(f"step total: off {totals['off']:.2f} s, share {totals['share']:.2f} s, on {totals['on']:.2f} s "
          f"(off/on {totals['off'] / totals['on']:.2f}x), "
          f"HF {totals['hf']:.2f} s (HF/on {totals['hf'] / totals['on']:.2f}x); prefill off {totals['prefill off']:.2f} s, "
          f"on {totals['prefill on']:.2f} s")
    print(f"common-prefix share, rounds 2+: would save {totals['prefix gain']:.2f} s of prefill = "
          f"{totals['prefix gain'] / totals['on']:.1%} of the step with sharing on")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    print(f"threads={torch.get_num_threads()}")
    for name in args.models:
        run_model(name, args)


if __name__ == "__main__":
    main()
