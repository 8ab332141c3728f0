"""Held-out accuracy during training: the workflow's verifier accuracy on questions never trained on, and what the
answers cost (chunks read, generated tokens per correct answer, gate decisions: memagent.training.gate_metrics).

Each rank evaluates every W-th question; sums are over ranks. Evaluation has no chunk cap (WorkflowConfig.max_chunks
None), so 4x-length documents are read in full, or up to where the exit gate stops reading.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
from transformers import PreTrainedTokenizerBase

from memagent.records import Reward, Sample
from memagent.rl.rewards import answer_score
from memagent.rollout.llm import LocalLLM
from memagent.rollout.prompts import WorkflowConfig
from memagent.rollout.sampling import SamplingParams
from memagent.rollout.workflow import run_memagent
from memagent.training.gate_metrics import gate_metrics


def heldout_metrics(
    model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, samples: list[Sample], workflow: WorkflowConfig,
    params: SamplingParams, *, rank: int, world_size: int, all_reduce_sum: Callable[[torch.Tensor], torch.Tensor],
    generator: torch.Generator | None = None, batch: int = 64, max_batch_rows: int | None = None,
    prefill_chunk_tokens: int = 0, kv_cache_budget_bytes: float = 0.0, verifier: str = "strict",
) -> dict[str, float]:
    """The held-out questions' mean verifier score under "accuracy" (one sample each, greedy by default), and their
    cost under gate_metrics' names without the "rollout/" and "gates/" prefixes ("chunks_read_share",
    "generated_tokens_per_correct", "keep_share", ...; the decision shares only with gates). verifier: a name in
    memagent.rl.rewards.VERIFIER_NAMES (strict: the last boxed answer equals a gold).

    batch: questions in flight at once, the next starting as one finishes (continuous batching by rounds).
    max_batch_rows, prefill_chunk_tokens and kv_cache_budget_bytes bound generation memory as in training rollouts (see LocalLLM).
    """
    workflow = dataclasses.replace(workflow, max_chunks=None)
    mine = samples[rank::world_size]
    llm = LocalLLM(model, tokenizer, params=params, generator=generator, max_batch_rows=max_batch_rows,
                   prefill_chunk_tokens=prefill_chunk_tokens, kv_cache_budget_bytes=kv_cache_budget_bytes)
    scored = run_memagent(mine, llm, workflow, group_size=1, keep_prompt_ids=False, max_running=batch)
    for traj in scored:
        traj.reward = Reward(correct=answer_score(verifier, traj.answer, mine[traj.sample_index]))
    total = all_reduce_sum(torch.tensor([sum(t.reward.correct for t in scored), float(len(scored))],
                                        dtype=torch.float64))
    cost = gate_metrics(scored, all_reduce_sum)
    return {"accuracy": float(total[0] / total[1]) if total[1] > 0 else 0.0,
            **{key.split("/", 1)[1]: value for key, value in cost.items()}}

