"""Held-out accuracy during training: the workflow's verifier accuracy on questions never trained on.

Each rank evaluates every W-th question; correct counts are summed over ranks. Evaluation has no chunk cap
(WorkflowConfig.max_chunks None), so 4x-length documents are read in full.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
from transformers import PreTrainedTokenizerBase

from memagent.records import Sample
from memagent.rl.rewards import answer_score
from memagent.rollout.llm import LocalLLM
from memagent.rollout.prompts import WorkflowConfig
from memagent.rollout.sampling import SamplingParams
from memagent.rollout.workflow import run_memagent


def heldout_accuracy(
    model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, samples: list[Sample], workflow: WorkflowConfig,
    params: SamplingParams, *, rank: int, world_size: int, all_reduce_sum: Callable[[torch.Tensor], torch.Tensor],
    generator: torch.Generator | None = None, batch: int = 64, max_batch_rows: int | None = None,
    prefill_chunk_tokens: int = 0, kv_cache_budget_bytes: float = 0.0, verifier: str = "strict",
) -> float:
    """Mean verifier score of the held-out questions (one sample each, greedy by default); verifier: a name in
    memagent.rl.rewards.VERIFIER_NAMES (strict: the last boxed answer equals a gold).

    max_batch_rows, prefill_chunk_tokens and kv_cache_budget_bytes bound generation memory as in training rollouts (see LocalLLM).
    """
    workflow = dataclasses.replace(workflow, max_chunks=None)
    mine = samples[rank::world_size]
    llm = LocalLLM(model, tokenizer, params=params, generator=generator, max_batch_rows=max_batch_rows,
                   prefill_chunk_tokens=prefill_chunk_tokens, kv_cache_budget_bytes=kv_cache_budget_bytes)
    correct = 0.0
    for start in range(0, len(mine), batch):
        part = mine[start : start + batch]
        for traj in run_memagent(part, llm, workflow, group_size=1, keep_prompt_ids=False):
            correct += answer_score(verifier, traj.answer, part[traj.sample_index])
    total = all_reduce_sum(torch.tensor([correct, float(len(mine))], dtype=torch.float64))
    return float(total[0] / total[1]) if total[1] > 0 else 0.0
