"""Step 2 of an RL step: the outcome reward of each trajectory, from its final answer alone (paper Sec. 3).

reward = verifier(final answer, golds) + DAPO's soft overlong penalty on the answer length (docs/rl-math.md §4).
The verifier is strict by default (the last \\boxed{...} equals a gold exactly, docs/workflow.md "Verifiers"), as in
MemAgent's training. `lenient` (memagent.verify.contained_reward: extract an answer, boxed or not; a gold must occur
inside it) is for small models that do not box their answers yet: under the strict rule their rewards are all 0,
and the overlong penalty would be the only signal. It is deliberately not the evaluation's sub-exact-match, which
also pays for an answer contained in a gold and so teaches a policy to answer a fragment (one digit of a number).
`task` (memagent.verify.task_reward) picks the rule by each question's task family, for a task mix: string_match_all
for RULER-style tasks (partial credit on multi-answer tasks), the contained rule for QA. Dynamic sampling filters on
`Reward.correct`, not on the total, so a partial-credit group is informative only when its scores differ.

Gated memory (docs/gates.md) may add an efficiency term, off by default: -read_cost x chunks read / chunks in the
document (memagent.rl.shaping.read_cost_penalty), so that with the exit gate, of two equally correct trajectories the
one that stopped reading earlier gets the higher reward. Dynamic sampling ignores it, as it ignores the overlong term.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from memagent.records import Reward, Sample, Trajectory
from memagent.rl.shaping import overlong_penalty, read_cost_penalty, write_cost_penalty
from memagent.verify import contained_reward, strict_reward, task_reward

VERIFIERS: dict[str, Callable[[str, Sequence[str]], float]] = {"strict": strict_reward, "lenient": contained_reward}
"""Training verifiers by name (rollout.verifier): response text, gold answers -> a score in [0, 1]."""
TASK_VERIFIER = "task"
"""rollout.verifier that picks the rule from the question's task (memagent.verify.task_reward)."""
VERIFIER_NAMES = (*VERIFIERS, TASK_VERIFIER)


def answer_score(verifier: str, response: str, sample: Sample) -> float:
    """Score in [0, 1] of one final answer to `sample` under the training verifier named `verifier`."""
    if verifier == TASK_VERIFIER:
        return task_reward(response, sample.answers, sample.task)
    return VERIFIERS[verifier](response, sample.answers)


def score_trajectories(
    trajectories: list[Trajectory], samples: list[Sample], *, verifier: str, answer_budget: int,
    overlong_shaping: bool, overlong_cache_tokens: int, overlong_factor: float, read_cost: float = 0.0,
    write_cost: float = 0.0, memory_budget: int = 1,
) -> None:
    """Set `traj.reward` of every trajectory (in place); `traj.sample_index` indexes `samples`.

    verifier: a name in VERIFIER_NAMES. answer_budget: max new tokens of the answer (L_max of the overlong penalty);
    the penalty ramps over its last `overlong_cache_tokens` tokens down to -overlong_factor, and is 0 when
    `overlong_shaping` is off. read_cost: lambda of the efficiency term (0 = off; `Reward.read_cost`). write_cost: mu of
    the memory-writing term over memory_budget tokens per chunk (0 = off; `Reward.write_cost`). A trajectory with an
    `error` (a failed LLM call) scores as a wrong answer.
    """
    if verifier not in VERIFIER_NAMES:
        raise ValueError(f"verifier={verifier!r}: expected one of {VERIFIER_NAMES}")
    correct = [0.0 if t.error else answer_score(verifier, t.answer, samples[t.sample_index]) for t in trajectories]
    penalty = [0.0] * len(trajectories)
    if overlong_shaping and trajectories:
        lengths = torch.tensor([t.answer_tokens for t in trajectories], dtype=torch.float64)  # [N]
        penalty = overlong_penalty(lengths, max_len=answer_budget, cache_len=overlong_cache_tokens,
                                   factor=overlong_factor).tolist()
    reading, writing = [0.0] * len(trajectories), [0.0] * len(trajectories)
    whole = torch.tensor([t.document_chunks for t in trajectories], dtype=torch.float64)  # [N]
    if read_cost and trajectories:
        read = torch.tensor([t.num_chunks for t in trajectories], dtype=torch.float64)  # [N]
        reading = read_cost_penalty(read, whole, cost=read_cost).tolist()
    if write_cost and trajectories:
        written = torch.tensor([t.memory_tokens_generated for t in trajectories], dtype=torch.float64)  # [N]
        writing = write_cost_penalty(written, whole, memory_budget=memory_budget, cost=write_cost).tolist()
    for traj, c, p, r, w in zip(trajectories, correct, penalty, reading, writing):
        traj.reward = Reward(correct=c, overlong=p, read_cost=r, write_cost=w)
