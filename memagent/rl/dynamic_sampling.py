"""Steps 1-3 of an RL step: roll out G trajectories per question, score them, keep the informative groups.

DAPO's dynamic sampling (docs/rl-math.md §1.8): a group whose G correctness scores are all equal has zero
advantage everywhere and teaches nothing, so it is dropped and the batch is refilled from the next questions, until
each rank's quota is full or `max_refill_rounds` extra rounds are spent. With it off, one round fills the batch.

The rollout and the scorer are callables (the trainer binds the model and the verifier), so this file is plain
bookkeeping over records. Ranks: every rank runs the same number of rounds and takes the same positions of the
global question stream (generation under ZeRO-3 gathers parameters collectively, so a rank that stopped early would
hang the others); `max_over_ranks` is the one collective.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from memagent.records import Sample, Trajectory
from memagent.rl.shaping import keep_informative_groups


class QuestionStream:
    """Indices 0..n-1 in a fresh seeded permutation every epoch; `position` counts indices handed out (the data
    state a checkpoint saves)."""

    def __init__(self, num_questions: int, seed: int, position: int = 0) -> None:
        if num_questions < 1:
            raise ValueError("the training set is empty: generate or pass at least one question")
        self.n, self.seed, self.position = num_questions, seed, position

    def take(self, k: int) -> list[int]:
        out = []
        for _ in range(k):
            epoch, offset = divmod(self.position, self.n)
            order = np.random.default_rng([self.seed, epoch]).permutation(self.n)
            out.append(int(order[offset]))
            self.position += 1
        return out


@dataclass
class KeptGroups:
    """This rank's kept groups of one step, and what it took to get them."""

    trajectories: list[Trajectory]
    """Trajectories of the kept groups, each group's G contiguous; sample_index indexes `questions`."""
    questions: list[Sample]
    """The questions of the kept groups, in order."""
    generated: list[Trajectory]
    """Every trajectory rolled out this step (kept or not), for the reward / accuracy metrics."""
    generated_tasks: list[str]
    """`Sample.task` of each trajectory in `generated`, for per-task accuracy in a task mix."""
    rounds: int
    """Rollout rounds run (1 = no refill)."""
    informative_groups: int
    """Groups rolled out this step whose scores differed (all of them without dynamic sampling); the ones beyond the
    quota were dropped, so informative_groups - len(questions) counts the refill's overshoot."""


def rank_quota(batch_size: int, rank: int, world_size: int) -> int:
    """Groups rank `rank` fills: batch_size split as evenly as possible, the first ranks taking the remainder."""
    return batch_size // world_size + (rank < batch_size % world_size)


def refill_size(need: int, kept: int, rolled: int, cap: float, margin_std: float) -> int:
    """Questions to roll out for `need` more informative groups, given `kept` of `rolled` so far.

    With keep rate p, k questions give about k*p kept groups, binomial std sqrt(k p (1 - p)); the refill is the
    smallest k with k*p - margin_std * std >= need. Informative groups beyond the quota are rolled out for nothing,
    about margin_std std of them on average, while a refill that falls short costs another round. For a quota of 8
    at keep rates 0.5 and 0.75, margin 2 drops 3.8 and 3.1 informative groups a step and margin 0.5 drops 2.3 and
    1.4, rolling out 13-15% fewer groups for 0.05-0.14 more rounds (bench/refill.py, BENCHMARKS.md).
    Capped at cap * need (p near 0 would ask for ever more); the first round (nothing rolled yet) asks for `need`.
    """
    if need <= 0 or rolled == 0:
        return max(need, 0)
    limit = max(need, math.ceil(cap * need))
    p = kept / rolled
    if p <= 0:
        return limit
    k = need
    while k < limit and k * p - margin_std * math.sqrt(k * p * (1 - p)) < need:
        k += 1
    return k


def collect_groups(
    stream: QuestionStream, samples: list[Sample], quota: int, *,
    rollout: Callable[[list[Sample]], list[Trajectory]], score: Callable[[list[Trajectory], list[Sample]], None],
    max_over_ranks: Callable[[int], int], rank: int, world_size: int, dynamic_sampling: bool,
    max_refill_rounds: int, refill_oversample_cap: float, refill_margin_std: float, filter_on: str = "correct",
) -> KeptGroups:
    """Fill `quota` groups on this rank: informative ones under dynamic sampling, any one otherwise.

    filter_on: what must differ within a group for it to be informative: "correct" (the verifier's score, DAPO's
    accuracy filter) or "reward" (the total with its shaping terms, e.g. gated memory's read cost, so a group whose
    answers are all right but read different amounts is kept).

    Each round, every rank asks for its own refill size; all ranks take max-over-ranks x W questions from the
    global stream, and rank r rolls out its share (every W-th), at most its own size. Trajectories are grouped by
    the position of their question in the round BEFORE they are relabelled to positions in `questions`.
    `score(trajectories, questions)` sets each trajectory's reward (memagent.rl.rewards.score_trajectories).
    """
    kept: list[Trajectory] = []
    questions: list[Sample] = []
    generated: list[Trajectory] = []
    generated_tasks: list[str] = []
    rounds = rolled_groups = kept_groups = 0
    while rounds <= max_refill_rounds:
        need = quota - len(questions)
        want = (refill_size(need, kept_groups, rolled_groups, refill_oversample_cap, refill_margin_std)
                if dynamic_sampling else need)
        k = max_over_ranks(want)
        if k == 0:
            break
        rounds += 1
        mine = [samples[i] for i in stream.take(k * world_size)[rank::world_size][:want]]
        trajs = rollout(mine)
        score(trajs, mine)
        generated += trajs
        generated_tasks += [mine[t.sample_index].task for t in trajs]  # before the relabelling below
        if dynamic_sampling:
            scores = [t.reward.total if filter_on == "reward" else t.reward.correct for t in trajs]
            groups = torch.tensor([t.sample_index for t in trajs], dtype=torch.long)  # [N]
            keep = keep_informative_groups(torch.tensor(scores, dtype=torch.float64), groups).tolist()
        else:
            keep = [True] * len(trajs)
        by_question: dict[int, list[Trajectory]] = {q: [] for q in range(len(mine))}
        for traj, keep_t in zip(trajs, keep):
            if keep_t:
                by_question[traj.sample_index].append(traj)
        rolled_groups += len(mine)
        kept_groups += sum(bool(m) for m in by_question.values())
        for q, sample in enumerate(mine):  # relabel only after grouping by the round's own positions
            members = by_question[q]
            if members and len(questions) < quota:
                for t in members:
                    t.sample_index = len(questions)
                kept += members
                questions.append(sample)
        if not dynamic_sampling:
            break
    short = max_over_ranks(quota - len(questions))
    if short and rank == 0:
        warnings.warn(f"dynamic sampling: after {rounds} rollout rounds some rank still lacks {short} of {quota} "
                      "informative groups; training on a smaller batch", stacklevel=2)
    return KeptGroups(kept, questions, generated, generated_tasks, rounds, kept_groups)
