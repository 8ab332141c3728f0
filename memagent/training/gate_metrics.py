"""What a rollout cost and what the gates decided (docs/gates.md), as step metrics summed over ranks.

Per question (one trajectory answers one question): chunks read, memory tokens (response tokens that wrote memory,
decision tokens excluded) and all generated tokens; generated tokens per correct answer (over the summed verifier
scores, so partial credit counts in part; left out when nothing was correct). With gates, the share of each decision
over all gated memory updates: an unparsed decision acts as UPDATE, so it is in `gates/update_share` and also
reported alone as `gates/unparsed`; keep + update + answer shares sum to 1. Without gates the `gates/` keys are
left out.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from memagent.records import Trajectory
from memagent.rollout.gates import ANSWER_NOW, KEEP, UNPARSED, UPDATE


def gate_metrics(
    trajectories: list[Trajectory], all_reduce_sum: Callable[[torch.Tensor], torch.Tensor]
) -> dict[str, float]:
    """`rollout/` cost metrics and `gates/` decision shares of the scored trajectories of every rank."""
    decisions = [d for t in trajectories for d in t.decisions]
    local = torch.tensor([
        len(trajectories), sum(t.num_chunks for t in trajectories), sum(t.document_chunks for t in trajectories),
        sum(t.memory_tokens_generated for t in trajectories), sum(t.generated_tokens for t in trajectories),
        sum(t.reward.correct for t in trajectories if t.reward is not None),
        *(decisions.count(d) for d in (KEEP, UPDATE, ANSWER_NOW, UNPARSED)),
    ], dtype=torch.float64)
    n, read, whole, memory, generated, correct, keep, update, answer, unparsed = all_reduce_sum(local).tolist()
    per_question = max(n, 1.0)
    out = {"rollout/chunks_read": read / per_question, "rollout/chunks_read_share": read / max(whole, 1.0),
           "rollout/memory_tokens_per_question": memory / per_question,
           "rollout/generated_tokens_per_question": generated / per_question}
    if correct > 0:
        out["rollout/generated_tokens_per_correct"] = generated / correct
    gated = keep + update + answer + unparsed
    if gated > 0:
        out |= {"gates/keep_share": keep / gated, "gates/update_share": (update + unparsed) / gated,
                "gates/answer_share": answer / gated, "gates/unparsed": unparsed / gated}
    return out
