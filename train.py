"""Train MemAgent with Multi-Conv DAPO (arXiv 2507.02259 Sec. 3; DAPO arXiv 2503.14476).

One RL step:
  1. Sample questions; roll out G trajectories each with the MemAgent workflow (read chunk, overwrite memory, ...,
     answer). A trajectory is K + 1 independent conversations.
  2. Reward = strict verifier on the final answer (1/0) + DAPO's soft overlong penalty on the answer length.
  3. Dynamic sampling: drop groups whose G correctness scores are all equal, refill from the next questions.
  4. A_i = (R_i - mean_g) / (std_g + eps), once per trajectory, broadcast to every conversation of it.
  5. Recompute old log-probs (no grad) [and reference log-probs for an optional KL loss].
  6. For each of `mini_batches` slices of the conversations: count the valid tokens over all ranks, then per
     micro-batch backprop DAPO's clipped token-level loss / N_global (x world size); clip, step AdamW.
Departures from MemAgent's released run, all DAPO's and configurable: clip_high 0.28 (theirs 0.2), dual clip 10
(theirs 3), std-scaled advantages (theirs R - mean), dynamic sampling and overlong shaping on, no KL (theirs 0.001).

Usage: `python train.py` (the tiny demo: builds a tiny model, warm-starts it on teacher memory traces (compact prompts,
then the workflow's own), runs RL and prints a held-out accuracy table), `python train.py --preset smoke`, `torchrun
--nproc_per_node 2 train.py --deepspeed configs/ds_zero2.json`, `--resume`, `--config FILE`,
`--loss.clip-high 0.28`; `--help` lists all.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

from memagent.config import load_config
from memagent.model.precision import autocast
from memagent.rl.step import (
    accumulate_gradients,
    global_counts,
    micro_batch_counts,
    set_logprobs,
    split_mini_batches,
)
from memagent.rollout.llm import LocalLLM
from memagent.rollout.records import Trajectory
from memagent.rollout.sampling import SamplingParams
from memagent.rollout.workflow import run_memagent
from memagent.training.checkpoint import load_checkpoint, save_checkpoint
from memagent.training.experience import QuestionStream, collect_groups, to_rows
from memagent.training.heldout import heldout_accuracy
from memagent.training.logging import MetricsLogger, progress, write_traces
from memagent.training.memory_budget import dry_run_report
from memagent.training.setup import Run, build_run


# ALGO LOGIC ---------------------------------------------------------------------------------------------------
def rollout(run: Run, questions: list) -> list[Trajectory]:
    """G trajectories per question with the current policy (ZeRO-3: parameters gathered for generation)."""
    r = run.cfg.rollout
    params = SamplingParams(temperature=r.temperature, top_p=r.top_p, top_k=r.top_k)
    with run.backend.generation() as model:
        llm = LocalLLM(model, run.tokenizer, params=params, generator=run.generator,
                       max_batch_rows=r.max_batch_rows or None, prefill_chunk_tokens=r.prefill_chunk_tokens,
                       kv_cache_budget_bytes=r.kv_cache_budget_gb * 2**30)
        return run_memagent(questions, llm, run.memory, group_size=r.group_size)


def rl_step(run: Run, stream: QuestionStream) -> tuple[dict[str, float], list[Trajectory], list]:
    """One Multi-Conv DAPO step (steps 1-6 of the module docstring). Returns metrics and the kept groups."""
    cfg, be = run.cfg, run.backend
    t0 = time.perf_counter()
    quota = cfg.rollout.batch_size // be.world_size + (be.rank < cfg.rollout.batch_size % be.world_size)
    batch = collect_groups(  # 1-3: rollout, reward, dynamic sampling
        stream, run.train, quota, cfg.rollout, rollout=lambda qs: rollout(run, qs),
        max_over_ranks=lambda n: int(be.all_reduce(torch.tensor(n), "max")), rank=be.rank,
        world_size=be.world_size, answer_tokens=cfg.workflow.answer_tokens)
    rows = to_rows(batch.kept, scale_by_std=cfg.loss.scale_by_std, eps=cfg.loss.adv_eps)  # 4: A once per trajectory
    t_rollout = time.perf_counter() - t0

    opt, temp = cfg.optim, cfg.rollout.temperature
    kw = dict(budget=opt.micro_batch_tokens, pad_id=run.tokenizer.pad_token_id, device=run.device, temperature=temp)
    minis = split_mini_batches(rows, opt.mini_batches)
    counts = micro_batch_counts(minis, opt.micro_batch_tokens, lambda t: be.all_reduce(t, "max"))
    set_logprobs(be.model, minis, counts, "old_logprobs", **kw)  # 5: packed as the update packs them: ratio 1 at first
    if run.reference is not None:
        set_logprobs(run.reference, minis, counts, "ref_logprobs", **kw)

    updates: list[dict[str, float]] = []
    show = cfg.run.progress and be.rank == 0 and len(minis) > 4
    for mini, m_micro in progress(list(zip(minis, counts)), desc="update", enabled=show):
        num_tokens, num_seqs = global_counts(mini, be.all_reduce_sum)  # 6: BEFORE the micro-batch loop
        if num_tokens == 0:
            continue
        metrics = accumulate_gradients(
            be.model, mini, **cfg.loss.update_args(), num_tokens=num_tokens, num_seqs=num_seqs, world_size=be.world_size,
            backward=be.backward, num_micro=m_micro, **kw)
        metrics["grad_norm"], skipped = be.step()
        metrics["skipped"] = float(skipped)
        if skipped and be.rank == 0:
            print(f"warning: gradient norm {metrics['grad_norm']} is not finite; update skipped", flush=True)
        updates.append(metrics)
    return summarize(run, batch, rows, updates, t_rollout, time.perf_counter() - t0), batch.kept, batch.questions


# PLUMBING -----------------------------------------------------------------------------------------------------
def summarize(run: Run, batch, rows, updates, t_rollout: float, t_step: float) -> dict[str, float]:
    """Step metrics, averaged over ranks (rollout) and over updates (loss)."""
    be = run.backend
    gen = batch.generated
    sampled = sum(len(c.response_ids) for t in gen for c in t.conversations)
    local = torch.tensor([sum(t.reward for t in gen), sum(t.extras["correct"] for t in gen), len(gen),
                          sum(t.extras["answer_len"] for t in gen), sum(t.extras["memory_len"] for t in gen),
                          len(batch.questions), sampled, len(rows)], dtype=torch.float64)
    s = be.all_reduce_sum(local)
    n = max(float(s[2]), 1.0)
    out = {"rollout/reward": float(s[0]) / n, "rollout/accuracy": float(s[1]) / n, "rollout/kept_groups": float(s[5]),
           "rollout/answer_len": float(s[3]) / n, "rollout/memory_len": float(s[4]) / n,
           "rollout/rounds": float(batch.rounds), "rollout/conversations": float(s[7]),
           "perf/tokens_per_s": float(s[6]) / max(t_step, 1e-9), "perf/rollout_s": t_rollout, "perf/step_s": t_step,
           "optim/lr": be.lr, "optim/updates": float(len(updates))}
    for key in ("loss", "clipfrac", "clipfrac_lower", "approx_kl", "entropy", "kl", "grad_norm", "skipped"):
        if updates:
            out[f"loss/{key}"] = sum(u[key] for u in updates) / len(updates)
    return out


def evaluate(run: Run) -> dict[str, float]:
    """Held-out strict accuracy at every evaluation length."""
    e = run.cfg.eval
    params = SamplingParams(temperature=e.temperature, top_p=e.top_p)
    with run.backend.generation() as model, autocast(run.device, run.autocast_dtype):
        return {f"eval/accuracy_{name}": heldout_accuracy(
            model, run.tokenizer, samples, run.memory, params, rank=run.backend.rank,
            world_size=run.backend.world_size, all_reduce_sum=run.backend.all_reduce_sum, generator=run.generator,
            max_batch_rows=run.cfg.rollout.max_batch_rows or None, prefill_chunk_tokens=run.cfg.rollout.prefill_chunk_tokens,
            kv_cache_budget_bytes=run.cfg.rollout.kv_cache_budget_gb * 2**30)
            for name, samples in run.heldout.items()}


def results_table(before: dict[str, float], after: dict[str, float]) -> str:
    """Markdown table of held-out accuracy before (warm start) and after RL, per evaluation length."""
    lines = ["| held-out set | warm start | after RL | change |", "|---|---|---|---|"]
    for key in before:
        name = key.removeprefix("eval/accuracy_")
        b, a = 100 * before[key], 100 * after.get(key, float("nan"))
        lines.append(f"| {name} chunks x train | {b:.1f} | {a:.1f} | {a - b:+.1f} |")
    return "\n".join(lines)


def dry_run_flags(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    """`--dry-run [--dry-run-world-size N]` (N defaults to the launcher's WORLD_SIZE, else 1), and the other flags."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--dry-run-world-size", type=int, default=int(os.environ.get("WORLD_SIZE", 1)))
    return parser.parse_known_args(argv)


def main(argv: list[str] | None = None) -> dict[str, float]:
    flags, argv = dry_run_flags(argv)
    cfg = load_config(argv)
    if flags.dry_run:  # size the run from the model's config.json alone: no model, data or process group
        print(dry_run_report(cfg, flags.dry_run_world_size), flush=True)
        return {}
    run = build_run(cfg)
    be, out = run.backend, cfg.run.output_dir
    logger = MetricsLogger(out, rank=be.rank)
    state = {"position": 0, "before": {}}
    if run.resume_from is not None:
        state = load_checkpoint(be, run.resume_from, run.generator)
        if be.rank == 0:
            print(f"resumed from {run.resume_from} (step {state['step']})", flush=True)
    else:  # build_run warm-started the model before the backend wrapped it
        state["before"] = evaluate(run) if run.heldout else {}
        logger.log(0, state["before"])
    stream = QuestionStream(len(run.train), cfg.data.seed, state["position"])
    start = int(state.get("step", 0))
    metrics: dict[str, float] = {}
    for step in range(start + 1, cfg.run.steps + 1):
        with autocast(run.device, run.autocast_dtype):  # bf16 forwards over fp32 weights (model.autocast)
            metrics, kept, questions = rl_step(run, stream)
        if cfg.eval.every and step % cfg.eval.every == 0 and step < cfg.run.steps:
            metrics.update(evaluate(run))
        logger.log(step, metrics)
        if be.rank == 0 and cfg.run.trace_every and step % cfg.run.trace_every == 0:
            write_traces(Path(out) / "traces" / f"step_{step:06d}.txt", step, kept,
                         [questions[t.sample_index].question for t in kept],
                         [questions[t.sample_index].answers for t in kept])
        if (cfg.run.save_every and step % cfg.run.save_every == 0) or step == cfg.run.steps:
            save_checkpoint(be, run.tokenizer, out, step, {"position": stream.position, "before": state["before"],
                            "config": cfg}, run.generator, keep=cfg.run.keep_checkpoints)
    after = evaluate(run) if run.heldout else {}
    if be.rank == 0 and after:
        logger.log(cfg.run.steps, after)
        table = results_table(state["before"], after)
        print("\nHeld-out strict accuracy (%), greedy:\n" + table, flush=True)
        (Path(out) / "results.json").write_text(json.dumps({"before": state["before"], "after": after}))
    logger.close()
    return {**metrics, **after}


if __name__ == "__main__":
    from memagent.cli import run_cli

    def resume_hint(argv: list[str]) -> str:
        resume = [] if "--resume" in argv else ["--resume", "latest"]
        return (f"checkpoints are in {load_config(argv).run.output_dir}; continue from the latest with: "
                f"python train.py {' '.join([*argv, *resume])}")

    run_cli(main, on_interrupt=resume_hint)
