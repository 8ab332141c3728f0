"""One full Multi-Conv DAPO step (rollout, old log-probs, update): yesterday's defaults against today's, one change at a time.

    OMP_NUM_THREADS=2 .venv/bin/python bench/train_step.py [--models tiny smollm2 --questions 4 --group 4
        --chunks 2 --chunk-tokens 256 --memory-tokens 64 --answer-tokens 32 --budget 2048 --dtype auto --clock wall]

The step is train.py's steps 1-6 on niah_single_1 questions, shaped like the smollm2 preset (chunk 256, memory 64,
answer 32, micro-batch budget 2048; 4 of its 8 questions by default): Q x G trajectories of K memory updates plus
the answer, lenient reward, group advantages broadcast to every conversation, old log-probs packed as the update
packs them, then one AdamW update per mini-batch (--mini-batches, 2 as in the preset; the tables in BENCHMARKS.md
before "+own-first" was added used 1). Settings run side by side in one process, each
from the same initial weights and sampling seed, each adding one change to the one before:
  before         the defaults before issue 22: MemAgent's prompt order, old log-probs recomputed, every row's
                 prompt run whole in the log-prob and update forwards (bf16 where native, length-sorted packing
                 and shared prefill, issue 11's changes, are on in every setting)
  +prefix        rows sharing 64+ prompt tokens run them once per micro-batch (optim.shared_prefix_tokens 64)
  +own-first     no old-log-prob pass for the first mini-batch: its update runs under the weights that sampled, so
                 its own forward is the old policy (memagent.rl.step.update_policy); today's bf16 default
  +reuse         the sampler's log-probs as the old policy's, no old-log-prob pass (rollout.reuse_logprobs)
  +section-first the section before the memory (workflow.section_first): a group's prompts share the chunk,
                 in the rollout's prefill and in the update's prefixes
  +prefix+compile, +reuse+compile
                 today's defaults in bf16 (+prefix) and in fp32 (+reuse), with every MLP and RMSNorm compiled
                 (model.compile, memagent.model.compiled); compilation runs in an untimed warm-up step first,
                 whose seconds are printed (a training run pays them once, in its first step)
--settings picks which run (default: the first four; `before` always runs, as the reference).
Reported per setting: rollout, old log-prob and update seconds, the step's total, forwarded update tokens (the
shared prefixes counted once) and the speed-up of the step over `before`. --dtype: auto (bf16 autocast where native,
memagent.model.precision), float32, or bfloat16 (forced). Models: "tiny" (the demo's tiny Qwen2, built into
runs/bench/tiny if missing) and "smollm2" (models/smollm2-135m-instruct from `make smollm2`; skipped with a message
when absent). The last line is `step speedup (last setting vs before): X.XXx` of the last model.
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
from memagent.model.compiled import compile_elementwise  # noqa: E402
from memagent.model.precision import autocast, training_autocast  # noqa: E402
from memagent.rl import step  # noqa: E402
from memagent.rl.rewards import score_trajectories  # noqa: E402
from memagent.rl.rows import trajectories_to_rows  # noqa: E402
from memagent.rollout.llm import LocalLLM  # noqa: E402
from memagent.rollout.prompts import WorkflowConfig  # noqa: E402
from memagent.rollout.sampling import SamplingParams  # noqa: E402
from memagent.rollout.workflow import run_memagent  # noqa: E402

SMOLLM2 = ROOT / "models" / "smollm2-135m-instruct"
TINY = ROOT / "runs" / "bench" / "tiny"
SETTINGS = {"before": (0, False, False, False, False), "+prefix": (64, False, False, False, False),
            "+own-first": (64, False, False, False, True), "+reuse": (64, True, False, False, True),
            "+section-first": (64, True, True, False, True), "+prefix+compile": (64, False, False, True, False),
            "+reuse+compile": (64, True, False, True, False)}
"""name -> (shared prefix tokens of the training forwards, reuse the sampler's log-probs, section-first prompt,
compiled MLPs and norms, no old-log-prob pass for the first mini-batch)."""
DEFAULT_SETTINGS = ["before", "+prefix", "+own-first", "+reuse", "+section-first"]
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
LOSS = dict(clip_low=0.2, clip_high=0.28, clip_c=10.0, agg="token-mean", norm_len=None, kl_coef=0.0, kl_kind="k3")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["tiny", "smollm2"], choices=["tiny", "smollm2"])
    parser.add_argument("--questions", type=int, default=4)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--chunks", type=int, default=2)
    parser.add_argument("--chunk-tokens", type=int, default=256)
    parser.add_argument("--memory-tokens", type=int, default=64)
    parser.add_argument("--answer-tokens", type=int, default=32)
    parser.add_argument("--budget", type=int, default=2048, help="micro-batch token budget (rows x padded length)")
    parser.add_argument("--mini-batches", type=int, default=2, help="optimizer updates per step (smollm2 preset: 2)")
    parser.add_argument("--dtype", choices=["auto", "float32", "bfloat16"], default="auto",
                        help="auto: bf16 autocast where the hardware has it (memagent.model.precision)")
    parser.add_argument("--settings", nargs="+", default=DEFAULT_SETTINGS, choices=list(SETTINGS))
    parser.add_argument("--clock", choices=list(CLOCKS), default="wall",
                        help="wall, or cpu: the process's CPU time (use with OMP_NUM_THREADS=1 on a shared machine)")
    return parser.parse_args(argv)


def model_dir(name: str) -> Path | None:
    if name == "smollm2":
        return SMOLLM2 if (SMOLLM2 / "config.json").is_file() else None
    if not (TINY / "config.json").is_file():
        build_tiny_model(TINY, hidden_size=96, num_layers=3, intermediate_size=384, vocab_size=512, corpus=corpus())
    return TINY


def one_step(model: torch.nn.Module, tok, samples, workflow: WorkflowConfig, args: argparse.Namespace,
             amp: torch.dtype | None, *, shared_prefix: int, reuse: bool, own_first: bool) -> dict[str, float]:
    """Steps 1-6 once on `model` (updated in place); returns seconds per phase and the update's tokens."""
    clock = CLOCKS[args.clock]
    device = torch.device("cpu")
    out: dict[str, float] = {}
    t = clock()
    model.eval()
    with autocast(device, amp):
        llm = LocalLLM(model, tok, params=SamplingParams(temperature=1.0), generator=torch.Generator().manual_seed(0))
        trajs = run_memagent(samples, llm, workflow, group_size=args.group)
    score_trajectories(trajs, samples, verifier="lenient", answer_budget=workflow.answer_tokens,
                       overlong_shaping=True, overlong_cache_tokens=16, overlong_factor=1.0)
    rows = trajectories_to_rows(trajs, scale_by_std=True, eps=1e-6, reuse_logprobs=reuse)
    for r in rows:  # a constant-reward group has zero advantage; give every row a gradient for the timing
        r.advantage = r.advantage or 1.0
    out["rollout_s"] = clock() - t
    model.train()
    pack = dict(budget=args.budget, pad_id=tok.pad_token_id, device=device, temperature=1.0,
                shared_prefix=shared_prefix)
    minis = step.split_mini_batches(rows, args.mini_batches)
    counts = step.micro_batch_counts(minis, args.budget, lambda x: x.clone(), shared_prefix)
    first = 1 if own_first else 0
    t = clock()
    if not reuse:
        with autocast(device, amp):
            step.set_logprobs(model, minis[first:], counts[first:], "old_logprobs", **pack)
    out["old_logprobs_s"] = clock() - t
    if reuse:  # the drift of the reused log-probs from a recomputation (untimed): |delta| and ratios off by > 20%
        with autocast(device, amp):
            recomputed = step.response_logprobs(model, rows, **pack)
        delta = torch.cat([r.old_logprobs - lp for r, lp in zip(rows, recomputed)]).abs()
        out["drift_max"], out["drift_mean"] = float(delta.max()), float(delta.mean())
        out["drift_clipped"] = float((delta.exp() > 1.2).float().mean())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)

    def optimizer_step() -> tuple[float, bool]:
        opt.step()
        opt.zero_grad(set_to_none=True)
        return 0.0, False

    t = clock()
    updates = step.update_policy(model, minis, counts, **LOSS, **pack, world_size=1,
                                  all_reduce_sum=lambda x: x.clone(), backward=lambda loss, last: loss.backward(),
                                  optimizer_step=optimizer_step, forward_context=lambda: autocast(device, amp))
    out["update_s"] = clock() - t
    out["clipfrac"], out["approx_kl"] = updates[0]["clipfrac"], updates[0]["approx_kl"]
    out["step_s"] = out["rollout_s"] + out["old_logprobs_s"] + out["update_s"]
    plan = step.prefix_micro_batches(rows, args.budget, shared_prefix=shared_prefix)
    out["forwarded"] = float(sum(prefix + sum(len(r.input_ids) - prefix for r in group) for group, prefix in plan))
    return out


def run_model(name: str, args: argparse.Namespace) -> float | None:
    path = model_dir(name)
    if path is None:
        print(f"{name}: skipped, {SMOLLM2} not found (run `make smollm2`)", flush=True)
        return None
    tok = load_tokenizer(path)
    base = load_model(path, dtype=torch.float32, device="cpu")
    samples = make_task("niah_single_1", tok, args.chunk_tokens * args.chunks, args.questions, seed=0)
    amp = training_autocast(args.dtype if args.dtype != "float32" else "off", torch.device("cpu"), torch.float32)
    print(f"\n{name}: {args.questions} questions x G {args.group}, {args.chunks} chunks of {args.chunk_tokens}, "
          f"memory {args.memory_tokens}, answer {args.answer_tokens}, budget {args.budget}, "
          f"{'bf16 autocast' if amp else 'float32'}, {torch.get_num_threads()} threads, clock {args.clock}",
          flush=True)
    print("| setting | rollout s | old log-probs s | update s | step s | update tokens forwarded | step vs before | "
          "first update clipfrac | approx_kl |")
    print("|---|---|---|---|---|---|---|---|---|")
    results = {}
    labels = ["before"] + [label for label in args.settings if label != "before"]
    for label in labels:
        shared_prefix, reuse, section_first, compiled, own_first = SETTINGS[label]
        workflow = WorkflowConfig(chunk_tokens=args.chunk_tokens, memory_tokens=args.memory_tokens,
                                  answer_tokens=args.answer_tokens, max_chunks=args.chunks, question_tokens=64,
                                  section_first=section_first)
        model = copy.deepcopy(base)
        if compiled:
            compile_elementwise(model)
            t = time.perf_counter()
            one_step(model, tok, samples[:1], workflow, args, amp, shared_prefix=shared_prefix, reuse=reuse,
                     own_first=own_first)
            print(f"{label}: warm-up step (compilation) {time.perf_counter() - t:.1f} s wall, untimed", flush=True)
            model.load_state_dict(base.state_dict())  # the warm-up updated the weights: start from `base` again
        r = one_step(model, tok, samples, workflow, args, amp, shared_prefix=shared_prefix, reuse=reuse,
                     own_first=own_first)
        results[label] = r
        speed = results["before"]["step_s"] / r["step_s"]
        print(f"| {label} | {r['rollout_s']:.2f} | {r['old_logprobs_s']:.2f} | {r['update_s']:.2f} | "
              f"{r['step_s']:.2f} | {r['forwarded']:.0f} | {speed:.2f}x | {r['clipfrac']:.2e} | {r['approx_kl']:.2e} |",
              flush=True)
    drift = [(label, r) for label, r in results.items() if "drift_max" in r]
    for label, r in drift:
        print(f"{label}: reused vs recomputed old log-probs: max |delta| {r['drift_max']:.2e}, mean "
              f"{r['drift_mean']:.2e}, tokens whose ratio would be off by more than 20% {r['drift_clipped']:.2%}")
    return results["before"]["step_s"] / results[labels[-1]]["step_s"]


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    speedup = None
    for name in args.models:
        speedup = run_model(name, args) or speedup
    if speedup is not None:
        print(f"step speedup (last setting vs before): {speedup:.2f}x")


if __name__ == "__main__":
    main()
