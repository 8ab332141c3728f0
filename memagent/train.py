"""Train MemAgent with Multi-Conv DAPO (arXiv 2507.02259 Sec. 3; DAPO arXiv 2503.14476).

One RL step:
  1. Sample questions; roll out G trajectories each with the MemAgent workflow (read chunk, overwrite memory, ...,
     answer). A trajectory is K + 1 independent conversations.
  2. Reward = verifier on the final answer (strict 1/0 by default) + DAPO's soft overlong penalty on its length
     [+ gated memory's optional read cost, docs/gates.md].
  3. Dynamic sampling: drop groups whose G correctness scores are all equal, refill from the next questions.
  4. A_i = (R_i - mean_g) / (std_g + eps), once per trajectory, broadcast to every conversation of it.
  5. Old log-probs: recomputed (no grad), or the sampler's where they equal that to float32 rounding
     (rollout.reuse_logprobs); [reference log-probs for an optional KL loss].
  6. For each of `mini_batches` slices of the conversations: count the valid tokens over all ranks, then per
     micro-batch backprop DAPO's clipped token-level loss / N_global (x world size); clip, step AdamW.
Departures from MemAgent's released run, all DAPO's and configurable: clip_high 0.28 (theirs 0.2), dual clip 10
(theirs 3), std-scaled advantages (theirs R - mean), dynamic sampling and overlong shaping on, no KL (theirs 0.001).

Usage: `python train.py` with no model path runs the embedded demo (preset `tiny`, the one optional stage below:
builds a tiny model, warm-starts it on teacher memory traces, runs RL, prints a held-out table; docs/demo.md).
`python train.py --model.path DIR --data.train-file FILE` trains any HF model with the generic defaults (MemAgent's
scale, DAPO's recipe; no warm start). Also `--preset smoke|smollm2|qwen2.5-7b|memagent-release`, `torchrun
--nproc_per_node 2 train.py --deepspeed configs/ds_zero2.json`, `--resume`, `--config FILE`, `--loss.clip-high 0.28`,
`--dry-run`; `--help` lists all (docs/training.md). Installed (`pip install .`), the command is `memagent-train`;
`python train.py` in a checkout runs this file's `cli()`.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import asdict
from pathlib import Path

import torch

from memagent.cli import run_cli
from memagent.config import TrainConfig, load_config
from memagent.data.mix import parse_task_mix
from memagent.dirlock import lock_output_dir
from memagent.model.precision import autocast
from memagent.records import Sample, Trajectory
from memagent.rl.dynamic_sampling import KeptGroups, QuestionStream, collect_groups, rank_quota
from memagent.rl.rewards import score_trajectories
from memagent.rl.rows import trajectories_to_rows
from memagent.rl.step import micro_batch_counts, set_logprobs, split_mini_batches, update_policy
from memagent.rollout.llm import LocalLLM
from memagent.rollout.sampling import SamplingParams
from memagent.rollout.workflow import run_memagent
from memagent.training.checkpoint import load_checkpoint, save_checkpoint
from memagent.training.gate_metrics import gate_metrics
from memagent.training.heldout import heldout_metrics
from memagent.training.learner import dist_env
from memagent.training.logging import MetricsLogger, write_traces
from memagent.training.memory_budget import dry_run_report
from memagent.training.setup import PreRLStage, TrainingSetup, set_up_training, writable_output_dir


# ALGO LOGIC ---------------------------------------------------------------------------------------------------
def rollout(setup: TrainingSetup, questions: list[Sample]) -> list[Trajectory]:
    """G trajectories per question with the current policy (ZeRO-3: parameters gathered for generation)."""
    r = setup.cfg.rollout
    params = SamplingParams(temperature=r.temperature, top_p=r.top_p, top_k=r.top_k, prefix_explore=r.gate_explore)
    with setup.learner.generation() as model, autocast(setup.device, setup.autocast_dtype):
        llm = LocalLLM(model, setup.tokenizer, params=params, generator=setup.generator,
                       max_batch_rows=r.max_batch_rows or None, prefill_chunk_tokens=r.prefill_chunk_tokens,
                       kv_cache_budget_bytes=r.kv_cache_budget_gb * 2**30, share_prefill=r.share_prefill)
        return run_memagent(questions, llm, setup.cfg.workflow, group_size=r.group_size,
                            show_progress=setup.cfg.run.progress and setup.learner.rank == 0)


def shared_prefix_tokens(setup: TrainingSetup) -> int:
    """optim.shared_prefix_tokens where running a shared prompt prefix once is exact and adds no collective: one
    process, no gradient checkpointing (memagent.model.shared_prefix); else 0, every row runs whole."""
    plain = setup.learner.world_size > 1 or setup.cfg.model.gradient_checkpointing
    return 0 if plain else setup.cfg.optim.shared_prefix_tokens


def score(cfg: TrainConfig, trajectories: list[Trajectory], questions: list[Sample]) -> None:
    """Outcome reward of each trajectory: the verifier on its final answer + DAPO's overlong penalty (+ gated memory's
    read and write costs when rollout.read_cost or rollout.write_cost is set)."""
    r = cfg.rollout
    score_trajectories(trajectories, questions, verifier=r.verifier, answer_budget=cfg.workflow.answer_tokens,
                       overlong_shaping=r.overlong_shaping, overlong_cache_tokens=r.overlong_cache_tokens,
                       overlong_factor=r.overlong_factor, read_cost=r.read_cost, write_cost=r.write_cost,
                       memory_budget=cfg.workflow.memory_tokens)


def rl_step(setup: TrainingSetup, stream: QuestionStream) -> tuple[dict[str, float], KeptGroups]:
    """One Multi-Conv DAPO step (steps 1-6 of the module docstring). Returns metrics and the kept groups."""
    cfg, learner = setup.cfg, setup.learner
    r, opt = cfg.rollout, cfg.optim
    t0 = time.perf_counter()
    # 1-3: roll out G trajectories per question, score each by its final answer, keep the informative groups.
    kept = collect_groups(
        stream, setup.train, rank_quota(r.batch_size, learner.rank, learner.world_size),
        rollout=lambda qs: rollout(setup, qs), score=lambda trajs, qs: score(cfg, trajs, qs),
        max_over_ranks=learner.max_over_ranks, rank=learner.rank, world_size=learner.world_size,
        dynamic_sampling=r.dynamic_sampling, filter_on=r.filter_on, max_refill_rounds=r.max_refill_rounds,
        refill_oversample_cap=r.refill_oversample_cap, refill_margin_std=r.refill_margin_std)
    # 4: one group advantage per trajectory, broadcast to every conversation of it.
    reuse, shared = r.reuses_logprobs(setup.autocast_dtype), shared_prefix_tokens(setup)
    rows = trajectories_to_rows(kept.trajectories, scale_by_std=cfg.loss.scale_by_std, eps=cfg.loss.adv_eps,
                                reuse_logprobs=reuse)
    t_rollout = time.perf_counter() - t0
    # 5: old (and reference) log-probs, packed exactly as the update packs them: the first ratio is exactly 1.
    # (rollout.reuse_logprobs: the sampler's log-probs already are the old policy's, up to batch-shape rounding.)
    # Each phase opens its own bf16 autocast context and none spans an optimizer step, since autocast keeps its
    # bf16 copies of the fp32 weights until its outermost context exits (update_policy's forward_context).
    minis = split_mini_batches(rows, opt.mini_batches)
    counts = micro_batch_counts(minis, opt.micro_batch_tokens, learner.all_reduce_max, shared)
    packing = dict(budget=opt.micro_batch_tokens, pad_id=setup.tokenizer.pad_token_id, device=setup.device,
                   temperature=r.temperature, shared_prefix=shared)
    # Not for the first mini-batch: its update runs under the weights that sampled (update_policy).
    with autocast(setup.device, setup.autocast_dtype):
        if not reuse:
            set_logprobs(learner.model, minis[1:], counts[1:], "old_logprobs", **packing)
        if setup.reference is not None:
            set_logprobs(setup.reference, minis, counts, "ref_logprobs", **packing)
    # 6: one AdamW update per mini-batch on DAPO's clipped token-level loss over the global token count.
    updates = update_policy(
        learner.model, minis, counts, **cfg.loss.update_args(), **packing, world_size=learner.world_size,
        all_reduce_sum=learner.all_reduce_sum, backward=learner.backward, optimizer_step=learner.step,
        show_progress=cfg.run.progress and learner.rank == 0 and len(minis) > 4,
        forward_context=lambda: autocast(setup.device, setup.autocast_dtype))
    if learner.rank == 0 and any(u["skipped"] for u in updates):
        print("warning: a gradient norm was not finite; that update was skipped", flush=True)
    return summarize(setup, kept, len(rows), updates, t_rollout, time.perf_counter() - t0), kept


# PLUMBING -----------------------------------------------------------------------------------------------------
def summarize(setup: TrainingSetup, kept: KeptGroups, num_rows: int, updates: list[dict[str, float]],
              t_rollout: float, t_step: float) -> dict[str, float]:
    """Step metrics, averaged over ranks (rollout) and over updates (loss)."""
    gen = kept.generated
    sampled = sum(len(c.response_ids) for t in gen for c in t.conversations)
    rolled_conversations = sum(len(t.conversations) for t in gen)
    local = torch.tensor([sum(t.reward.total for t in gen), sum(t.reward.correct for t in gen), len(gen),
                          sum(t.answer_tokens for t in gen), sum(t.mean_memory_tokens for t in gen),
                          len(kept.questions), sampled, num_rows, len(gen) / setup.cfg.rollout.group_size,
                          kept.informative_groups, rolled_conversations], dtype=torch.float64)
    s = setup.learner.all_reduce_sum(local)
    n = max(float(s[2]), 1.0)
    # What dynamic sampling rolled out for nothing: groups with equal scores, informative groups past the quota,
    # and the share of rolled-out conversations that no update trains on.
    out = {"rollout/reward": float(s[0]) / n, "rollout/accuracy": float(s[1]) / n, "rollout/kept_groups": float(s[5]),
           "rollout/answer_len": float(s[3]) / n, "rollout/memory_len": float(s[4]) / n,
           "rollout/rounds": float(kept.rounds), "rollout/conversations": float(s[7]),
           "rollout/rolled_groups": float(s[8]), "rollout/uninformative_groups": float(s[8] - s[9]),
           "rollout/surplus_groups": float(s[9] - s[5]),
           "rollout/wasted_fraction": 1.0 - float(s[7]) / max(float(s[10]), 1.0),
           "perf/tokens_per_s": float(s[6]) / max(t_step, 1e-9), "perf/rollout_s": t_rollout, "perf/step_s": t_step,
           "optim/lr": setup.learner.lr, "optim/updates": float(len(updates))}
    for key in ("loss", "clipfrac", "clipfrac_lower", "approx_kl", "entropy", "kl", "grad_norm", "skipped"):
        if updates:
            out[f"loss/{key}"] = sum(u[key] for u in updates) / len(updates)
    return out | task_accuracy(setup, kept) | gate_metrics(gen, setup.learner.all_reduce_sum)


def task_accuracy(setup: TrainingSetup, kept: KeptGroups) -> dict[str, float]:
    """`rollout/accuracy/{task}` of a task mix (data.tasks): mean verifier score of the task's rolled-out
    trajectories over all ranks; a task no rank drew this step is left out."""
    names = [share.name for share in parse_task_mix(setup.cfg.data.tasks)]
    if not names:
        return {}
    local = torch.zeros(len(names), 2, dtype=torch.float64)  # [tasks, (score sum, trajectories)]
    for traj, task in zip(kept.generated, kept.generated_tasks):
        if task in names:
            local[names.index(task)] += torch.tensor([traj.reward.correct, 1.0], dtype=torch.float64)
    s = setup.learner.all_reduce_sum(local)
    return {f"rollout/accuracy/{name}": float(s[i, 0] / s[i, 1]) for i, name in enumerate(names) if s[i, 1] > 0}


def evaluate(setup: TrainingSetup) -> dict[str, float]:
    """Held-out accuracy (the training verifier) at every evaluation length, and what the answers cost:
    `eval/{metric}_{set}` for the metrics of memagent.training.heldout.heldout_metrics (accuracy, chunks read,
    generated tokens per correct answer, gate decisions), and the set's wall time over its questions as
    `perf/eval_seconds_per_question_{set}` (perf/, like every timing: a resumed run reproduces everything else)."""
    e, r, learner = setup.cfg.eval, setup.cfg.rollout, setup.learner
    params = SamplingParams(temperature=e.temperature, top_p=e.top_p)
    out: dict[str, float] = {}
    with learner.generation() as model, autocast(setup.device, setup.autocast_dtype):
        for name, samples in setup.heldout.items():
            started = time.perf_counter()
            metrics = heldout_metrics(
                model, setup.tokenizer, samples, setup.cfg.workflow, params, rank=learner.rank,
                world_size=learner.world_size, all_reduce_sum=learner.all_reduce_sum, generator=setup.generator,
                max_batch_rows=r.max_batch_rows or None, prefill_chunk_tokens=r.prefill_chunk_tokens,
                kv_cache_budget_bytes=r.kv_cache_budget_gb * 2**30, verifier=r.verifier)
            out |= {f"eval/{metric}_{name}": value for metric, value in metrics.items()}
            out[f"perf/eval_seconds_per_question_{name}"] = (time.perf_counter() - started) / max(len(samples), 1)
    return out


def results_table(before: dict[str, float], after: dict[str, float]) -> str:
    """Markdown table of held-out accuracy, chunks read and generated tokens per correct answer, before RL (after any
    warm start) and after RL, per evaluation length (a run recorded before the cost metrics shows accuracy only)."""
    lines = ["| held-out set | accuracy before RL | after RL | change | chunks read, before / after | "
             "generated tokens per correct, before / after |", "|---|---|---|---|---|---|"]

    def cost(metric: str, name: str, fmt: str) -> str:
        values = [d.get(f"eval/{metric}_{name}") for d in (before, after)]
        return " / ".join("—" if v is None else format(100 * v if metric.endswith("share") else v, fmt)
                          for v in values)

    for key in before:
        if not key.startswith("eval/accuracy_"):
            continue
        name = key.removeprefix("eval/accuracy_")
        b, a = 100 * before[key], 100 * after.get(key, float("nan"))
        lines.append(f"| {name} chunks x train | {b:.1f} | {a:.1f} | {a - b:+.1f} | "
                     f"{cost('chunks_read_share', name, '.0f')} % | {cost('generated_tokens_per_correct', name, '.1f')} |")
    return "\n".join(lines)


def dry_run_flags(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    """`--dry-run [--dry-run-world-size N]` (N defaults to the launcher's WORLD_SIZE, else 1), and the other flags."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--dry-run-world-size", type=int, default=int(os.environ.get("WORLD_SIZE", 1)))
    return parser.parse_known_args(argv)


def pre_rl_stage(cfg: TrainConfig) -> PreRLStage | None:
    """The embedded demo's stage (tiny model, code_lookup, warm start; docs/demo.md) when demo.enabled, else none."""
    if not cfg.demo.enabled:
        return None
    from memagent.demo import DemoStage  # the generic trainer imports nothing of the demo otherwise

    return DemoStage(cfg)


def main(argv: list[str] | None = None) -> dict[str, float]:
    flags, argv = dry_run_flags(argv)
    cfg = load_config(argv)
    if flags.dry_run:  # size the run from the model's config.json alone: no model, data or process group
        print(dry_run_report(cfg, flags.dry_run_world_size), flush=True)
        return {}
    # One writer per output directory (memagent.dirlock): a second run there would interleave metrics.jsonl and
    # save over this one's checkpoints; it stops at once, naming this process.
    with lock_output_dir(writable_output_dir(cfg.run.output_dir), rank=dist_env()[0]):
        return train(cfg)


def train(cfg: TrainConfig) -> dict[str, float]:
    """Set up, run cfg.run.steps RL steps (resuming from a checkpoint if asked), evaluate; returns the last metrics."""
    setup = set_up_training(cfg, pre_rl_stage(cfg))
    learner, out = setup.learner, cfg.run.output_dir
    state = {"position": 0, "before": {}}
    if setup.resume_from is not None:
        state = load_checkpoint(learner, setup.resume_from, setup.generator)
        if learner.rank == 0:
            print(f"resumed from {setup.resume_from} (step {state['step']})", flush=True)
    # On resume, the records of steps after the checkpoint (logged before a stop cut their checkpoint) are dropped:
    # those steps run again and log anew.
    logger = MetricsLogger(out, rank=learner.rank, after_step=state.get("step") if setup.resume_from else None)
    if setup.resume_from is None:
        # any warm start ran before the learner wrapped the model
        state["before"] = evaluate(setup) if setup.heldout else {}
        logger.log(0, state["before"])
    stream = QuestionStream(len(setup.train), cfg.data.seed, state["position"])
    start = int(state.get("step", 0))
    metrics: dict[str, float] = {}
    for step in range(start + 1, cfg.run.steps + 1):
        metrics, kept = rl_step(setup, stream)
        if cfg.eval.every and step % cfg.eval.every == 0 and step < cfg.run.steps:
            metrics.update(evaluate(setup))
        logger.log(step, metrics)
        if learner.rank == 0 and cfg.run.trace_every and step % cfg.run.trace_every == 0:
            write_traces(Path(out) / "traces" / f"step_{step:06d}.txt", step, kept.trajectories,
                         [kept.questions[t.sample_index].question for t in kept.trajectories],
                         [kept.questions[t.sample_index].answers for t in kept.trajectories])
        if (cfg.run.save_every and step % cfg.run.save_every == 0) or step == cfg.run.steps:
            save_checkpoint(learner, setup.tokenizer, out, step, {"position": stream.position,
                            "before": state["before"], "config": asdict(cfg), "arithmetic": setup.arithmetic},
                            setup.generator, keep=cfg.run.keep_checkpoints,
                            merged_dtype=getattr(torch, cfg.model.lora_merged_dtype))
    after = evaluate(setup) if setup.heldout else {}
    if learner.rank == 0 and after:
        logger.log(cfg.run.steps, after)
        table = results_table(state["before"], after)
        sampling = "greedy" if cfg.eval.temperature == 0 else f"temperature {cfg.eval.temperature}"
        print(f"\nHeld-out {cfg.rollout.verifier} accuracy (%) and cost, {sampling}:\n" + table, flush=True)
        (Path(out) / "results.json").write_text(json.dumps({"before": state["before"], "after": after}))
    logger.close()
    return {**metrics, **after}


def resume_hint(argv: list[str]) -> str:
    """How to continue a stopped run: the same command with --resume latest."""
    resume = [] if "--resume" in argv else ["--resume", "latest"]
    return (f"checkpoints are in {load_config(argv).run.output_dir}; continue from the latest with: "
            f"python train.py {' '.join([*argv, *resume])}")


def is_lost_rank_error(err: RuntimeError) -> bool:
    """A collective failed because a peer is gone: NCCL's DistBackendError, or gloo's transport error (a plain
    RuntimeError from gloo/transport: a collective timeout, or a connection the dead peer's kernel reset)."""
    return isinstance(err, torch.distributed.DistBackendError) or "gloo/transport" in str(err)


def main_or_lost_rank(argv: list[str]) -> dict[str, float]:
    """main(), with a collective that failed because another rank died or hung turned into a one-line user error
    (rank, the backend's first line, how to resume) instead of a backend traceback."""
    try:
        return main(argv)
    except RuntimeError as err:
        if not is_lost_rank_error(err):
            raise
        first = str(err).strip().splitlines()[0]
        raise SystemExit(f"rank {os.environ.get('RANK', '0')}: a collective failed, so another rank died or stopped "
                         f"answering (run.collective_timeout_s bounds the wait): {first}; restart every rank; "
                         f"{resume_hint(argv)}") from err


def cli() -> None:
    """`memagent-train` and `python train.py`: main() with one-line user errors, and on Ctrl-C how to resume."""
    run_cli(main_or_lost_rank, on_interrupt=resume_hint)


if __name__ == "__main__":
    cli()
