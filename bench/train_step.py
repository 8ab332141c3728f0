"""One full Multi-Conv DAPO step (rollout, old log-probs, update) with the throughput features off and on.

    OMP_NUM_THREADS=2 .venv/bin/python bench/train_step.py [--models tiny smollm2 --questions 2 --group 4
        --chunks 2 --chunk-tokens 256 --memory-tokens 64 --answer-tokens 32 --budget 4096 --clock wall]

The step is train.py's steps 1-6 on niah_single_1 questions: Q x G trajectories of K memory updates plus the
answer, lenient reward, group advantages broadcast to every conversation, old log-probs packed as the update packs
them, then one AdamW update over all rows (mini_batches 1). Four settings run side by side in one process, each from
the same initial weights and the same sampling seed, adding one feature at a time (issue 11, items 1-3):
  none      fp32 forwards, micro-batches cut in trajectory order (padded), shared prefill off
  +bf16     bf16 autocast over the fp32 weights (memagent.model.precision)
  +packed   + length-sorted packing (memagent.rl.packing.pack_by_length, what micro_batches uses)
  +shared   + identical prompts prefilled once (memagent.rollout.generate share_prefill)
"padded" switches micro_batches back to the in-order packing for the bench (it patches memagent.rl.step's packer;
the library has one packing). Reported per setting: rollout, old log-prob and update seconds, update tokens/s (real
row tokens / update seconds) and the padded fraction of the update's micro-batches. Models: "tiny" (the demo's
tiny Qwen2, built into runs/bench/tiny if missing) and "smollm2" (models/smollm2-135m-instruct from `make smollm2`;
skipped with a message when absent). The last line is `update speedup (all of 1-3 vs none): X.XXx` of the last model.
bf16 runs only where it is native (memagent.model.precision: CUDA, or a CPU with AVX512-BF16/AMX); elsewhere torch
emulates it, many times slower than fp32, so the bf16 rows are skipped with a message and "all" is packed + shared
in fp32 (`--force-bf16` runs them anyway).
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

from memagent.data import make_task  # noqa: E402
from memagent.demo.task import corpus  # noqa: E402
from memagent.model import build_tiny_model, load_model, load_tokenizer  # noqa: E402
from memagent.model.precision import autocast, training_autocast  # noqa: E402
from memagent.rl import packing, step  # noqa: E402
from memagent.rl.rewards import score_trajectories  # noqa: E402
from memagent.rl.rows import trajectories_to_rows  # noqa: E402
from memagent.rollout.llm import LocalLLM  # noqa: E402
from memagent.rollout.prompts import WorkflowConfig  # noqa: E402
from memagent.rollout.sampling import SamplingParams  # noqa: E402
from memagent.rollout.workflow import run_memagent  # noqa: E402

SMOLLM2 = ROOT / "models" / "smollm2-135m-instruct"
TINY = ROOT / "runs" / "bench" / "tiny"
SETTINGS = [("none", False, False, False), ("+bf16", True, False, False), ("+packed", True, True, False),
            ("+shared", True, True, True)]
"""(name, bf16 autocast, length-sorted packing, shared prefill), each adding one feature."""
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
LOSS = dict(clip_low=0.2, clip_high=0.28, clip_c=10.0, agg="token-mean", norm_len=None, kl_coef=0.0, kl_kind="k3")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["tiny", "smollm2"], choices=["tiny", "smollm2"])
    parser.add_argument("--questions", type=int, default=2)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--chunks", type=int, default=2)
    parser.add_argument("--chunk-tokens", type=int, default=256)
    parser.add_argument("--memory-tokens", type=int, default=64)
    parser.add_argument("--answer-tokens", type=int, default=32)
    parser.add_argument("--budget", type=int, default=4096, help="micro-batch token budget (rows x padded length)")
    parser.add_argument("--force-bf16", action="store_true", help="run the bf16 rows on a CPU without native bf16")
    parser.add_argument("--clock", choices=list(CLOCKS), default="wall",
                        help="wall, or cpu: the process's CPU time (use with OMP_NUM_THREADS=1 on a shared machine)")
    return parser.parse_args(argv)


def model_dir(name: str) -> Path | None:
    if name == "smollm2":
        return SMOLLM2 if (SMOLLM2 / "config.json").is_file() else None
    if not (TINY / "config.json").is_file():
        build_tiny_model(TINY, hidden_size=96, num_layers=3, intermediate_size=384, vocab_size=512, corpus=corpus())
    return TINY


def one_step(model: torch.nn.Module, tok, samples, workflow: WorkflowConfig, args: argparse.Namespace, *,
             bf16: bool, sort: bool, share: bool) -> dict[str, float]:
    """Steps 1-6 once on `model` (updated in place); returns seconds, tokens/s and the padded fraction."""
    amp = torch.bfloat16 if bf16 else None
    clock = CLOCKS[args.clock]
    step.pack_by_length = packing.pack_by_length if sort else lambda lengths, budget: packing.pack_by_token_budget(
        lengths, budget)
    device = torch.device("cpu")
    out: dict[str, float] = {}
    with autocast(device, amp):
        t = clock()
        model.eval()
        llm = LocalLLM(model, tok, params=SamplingParams(temperature=1.0), share_prefill=share,
                       generator=torch.Generator().manual_seed(0))
        trajs = run_memagent(samples, llm, workflow, group_size=args.group)
        score_trajectories(trajs, samples, verifier="lenient", answer_budget=workflow.answer_tokens,
                           overlong_shaping=True, overlong_cache_tokens=16, overlong_factor=1.0)
        rows = trajectories_to_rows(trajs, scale_by_std=True, eps=1e-6)
        for r in rows:  # a constant-reward group has zero advantage; give every row a gradient for the timing
            r.advantage = r.advantage or 1.0
        out["rollout_s"] = clock() - t
        model.train()
        pack = dict(budget=args.budget, pad_id=tok.pad_token_id, device=device, temperature=1.0)
        minis, counts = [rows], [len(step.micro_batches(rows, args.budget))]
        t = clock()
        step.set_logprobs(model, minis, counts, "old_logprobs", **pack)
        out["old_logprobs_s"] = clock() - t
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)

    def optimizer_step() -> tuple[float, bool]:
        opt.step()
        opt.zero_grad(set_to_none=True)
        return 0.0, False

    t = clock()
    step.update_policy(model, minis, counts, **LOSS, **pack, world_size=1, all_reduce_sum=lambda x: x.clone(),
                       backward=lambda loss, last: loss.backward(), optimizer_step=optimizer_step,
                       forward_context=lambda: autocast(device, amp))
    out["update_s"] = clock() - t
    lengths = [len(r.input_ids) for r in rows]
    out["tokens"] = float(sum(lengths))
    out["update_tok_s"] = out["tokens"] / out["update_s"]
    out["padded"] = packing.padded_fraction(lengths, step.pack_by_length(lengths, args.budget))
    return out


def run_model(name: str, args: argparse.Namespace) -> float | None:
    path = model_dir(name)
    if path is None:
        print(f"{name}: skipped, {SMOLLM2} not found (run `make smollm2`)", flush=True)
        return None
    tok = load_tokenizer(path)
    base = load_model(path, dtype=torch.float32, device="cpu")
    workflow = WorkflowConfig(chunk_tokens=args.chunk_tokens, memory_tokens=args.memory_tokens,
                              answer_tokens=args.answer_tokens, max_chunks=args.chunks, question_tokens=64)
    samples = make_task("niah_single_1", tok, args.chunk_tokens * args.chunks, args.questions, seed=0)
    print(f"\n{name}: {args.questions} questions x G {args.group}, {args.chunks} chunks of {args.chunk_tokens}, "
          f"memory {args.memory_tokens}, answer {args.answer_tokens}, budget {args.budget}", flush=True)
    native = training_autocast("auto", torch.device("cpu"), torch.float32) is not None
    if not (native or args.force_bf16):
        print("bf16 is not native on this CPU (no AVX512-BF16/AMX): the bf16 rows are skipped and the rest run in fp32")
    print("| setting | rollout s | old log-probs s | update s | row tokens | update tok/s | padded | vs none |")
    print("|---|---|---|---|---|---|---|---|")
    results = {}
    for label, bf16, sort, share in SETTINGS:
        bf16 = bf16 and (native or args.force_bf16)
        if label == "+bf16" and not bf16:
            continue
        r = one_step(copy.deepcopy(base), tok, samples, workflow, args, bf16=bf16, sort=sort, share=share)
        results[label] = r
        speed = r["update_tok_s"] / results["none"]["update_tok_s"]
        print(f"| {label} | {r['rollout_s']:.2f} | {r['old_logprobs_s']:.2f} | {r['update_s']:.2f} | "
              f"{r['tokens']:.0f} | {r['update_tok_s']:.0f} | {100 * r['padded']:.1f}% | {speed:.2f}x |", flush=True)
    step.pack_by_length = packing.pack_by_length
    return results["+shared"]["update_tok_s"] / results["none"]["update_tok_s"]


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    speedup = None
    for name in args.models:
        speedup = run_model(name, args) or speedup
    if speedup is not None:
        print(f"update speedup (all of 1-3 vs none): {speedup:.2f}x")


if __name__ == "__main__":
    main()
