"""From questions to training rows: the question stream, rewards, dynamic sampling, advantages per conversation.

- QuestionStream: an endless stream of training-question indices, reshuffled every epoch from the seed; its
  position is the data state saved in checkpoints.
- score: the strict verifier on each trajectory's final answer (1/0), plus DAPO's soft overlong penalty on the
  answer length (docs/rl-math.md §4); dynamic sampling filters on correctness, as DAPO's recipe (metric "acc").
- collect_groups: DAPO dynamic sampling (§1.8): roll out G per question, keep groups whose correctness varies,
  refill from the next questions until this rank's quota is full or `max_refill_rounds` extra rounds are spent.
  Every rank runs the same number of rounds (generation under ZeRO-3 gathers parameters collectively).
- to_rows: one group advantage per trajectory, broadcast to every conversation (memory updates and the answer).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from memagent.config import RolloutConfig
from memagent.data.records import Sample
from memagent.rl.advantages import broadcast_to_conversations, group_advantages
from memagent.rl.shaping import keep_informative_groups, overlong_penalty
from memagent.rl.step import TrainRow
from memagent.rollout.records import ANSWER, MEMORY, Trajectory
from memagent.verify.strict import strict_reward


class QuestionStream:
    """Indices 0..n-1 in a fresh seeded permutation every epoch; `position` counts indices handed out."""

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


def score(trajectories: list[Trajectory], samples: list[Sample], cfg: RolloutConfig, answer_tokens: int) -> None:
    """Fill traj.reward = correct + overlong penalty, extras correct / answer_len / memory_len (in place)."""
    for traj in trajectories:
        answer = [c for c in traj.conversations if c.kind == ANSWER]
        traj.extras["correct"] = strict_reward(traj.answer, samples[traj.sample_index].answers)
        traj.extras["answer_len"] = float(len(answer[-1].response_ids)) if answer else 0.0
        memories = [len(c.response_ids) for c in traj.conversations if c.kind == MEMORY]
        traj.extras["memory_len"] = float(np.mean(memories)) if memories else 0.0
    correct = torch.tensor([t.extras["correct"] for t in trajectories], dtype=torch.float64)
    reward = correct.clone()
    if cfg.overlong_shaping and trajectories:
        lengths = torch.tensor([t.extras["answer_len"] for t in trajectories], dtype=torch.float64)
        reward += overlong_penalty(lengths, max_len=answer_tokens, cache_len=cfg.overlong_cache_tokens,
                                   factor=cfg.overlong_factor)
    for traj, r in zip(trajectories, reward.tolist()):
        traj.reward = r


@dataclass
class Collected:
    """This rank's kept groups of one step, and what it took to get them."""

    kept: list[Trajectory]
    """Trajectories of the kept groups, each group's G contiguous; sample_index indexes `questions`."""
    questions: list[Sample]
    """The questions of the kept groups, in order."""
    generated: list[Trajectory]
    """Every trajectory rolled out this step (kept or not), for the reward / accuracy metrics."""
    rounds: int
    """Rollout rounds run (1 = no refill)."""


def refill_size(need: int, kept: int, rolled: int, cap: float) -> int:
    """Questions to roll out for `need` more informative groups, given `kept` of `rolled` so far.

    With keep rate p, k questions give about k*p kept groups, binomial std sqrt(k p (1 - p)); the smallest k
    with k*p - 2 std >= need makes one refill usually enough. Capped at cap * need (p near 0 would ask for
    ever more); the first round (nothing rolled yet) asks for `need`.
    """
    if need <= 0 or rolled == 0:
        return max(need, 0)
    limit = max(need, math.ceil(cap * need))
    p = kept / rolled
    if p <= 0:
        return limit
    k = need
    while k < limit and k * p - 2 * math.sqrt(k * p * (1 - p)) < need:
        k += 1
    return k


def collect_groups(
    stream: QuestionStream, samples: list[Sample], quota: int, cfg: RolloutConfig, *,
    rollout: Callable[[list[Sample]], list[Trajectory]], max_over_ranks: Callable[[int], int],
    rank: int, world_size: int, answer_tokens: int,
) -> Collected:
    """Dynamic sampling: fill `quota` groups on this rank with informative groups (all groups without it).

    Each round, every rank asks for its own refill size; all ranks take max-over-ranks x W questions from the
    global stream (so the stream stays in step and generation, a collective under ZeRO-3, runs the same number
    of rounds everywhere), and rank r rolls out its share, at most its own size. Trajectories are grouped by the
    position of their question in the round BEFORE they are relabelled to positions in `questions`.
    """
    kept: list[Trajectory] = []
    questions: list[Sample] = []
    generated: list[Trajectory] = []
    rounds = rolled_groups = kept_groups = 0
    while rounds <= cfg.max_refill_rounds:
        need = quota - len(questions)
        want = refill_size(need, kept_groups, rolled_groups, cfg.refill_oversample_cap) if cfg.dynamic_sampling \
            else need
        k = max_over_ranks(want)
        if k == 0:
            break
        rounds += 1
        # Every rank takes the same k * W questions from the global stream: rank r gets every W-th of them.
        mine = [samples[i] for i in stream.take(k * world_size)[rank::world_size][:want]]
        trajs = rollout(mine)
        score(trajs, mine, cfg, answer_tokens)
        generated += trajs
        rewards = torch.tensor([t.extras["correct"] for t in trajs], dtype=torch.float64)
        groups = torch.tensor([t.sample_index for t in trajs], dtype=torch.long)
        keep = keep_informative_groups(rewards, groups) if cfg.dynamic_sampling else torch.ones(len(trajs), dtype=torch.bool)
        by_question: dict[int, list[Trajectory]] = {q: [] for q in range(len(mine))}
        for traj, keep_t in zip(trajs, keep.tolist()):
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
        if not cfg.dynamic_sampling:
            break
    short = max_over_ranks(quota - len(questions))
    if short and rank == 0:
        warnings.warn(f"dynamic sampling: after {rounds} rollout rounds some rank still lacks {short} of {quota} "
                      "informative groups; training on a smaller batch", stacklevel=2)
    return Collected(kept, questions, generated, rounds)


def to_rows(kept: list[Trajectory], *, scale_by_std: bool, eps: float) -> list[TrainRow]:
    """One row per conversation; the group advantage is computed once per trajectory, then broadcast."""
    if not kept:
        return []
    rewards = torch.tensor([t.reward for t in kept], dtype=torch.float64)
    groups = torch.tensor([t.sample_index for t in kept])
    adv = group_advantages(rewards, groups, scale_by_std=scale_by_std, eps=eps)  # [N], once per trajectory
    conv_traj = torch.tensor([i for i, t in enumerate(kept) for _ in t.conversations])  # [M]
    conv_adv = broadcast_to_conversations(adv, conv_traj)  # [M]
    convs = [c for t in kept for c in t.conversations]
    return [
        TrainRow(input_ids=c.prompt_ids + c.response_ids, prompt_len=len(c.prompt_ids),
                 response_mask=list(c.response_mask), advantage=float(a))
        for c, a in zip(convs, conv_adv.tolist())
    ]
