"""What dynamic sampling's refills cost, by keep rate and refill margin: a simulation of the binomial draws.

    .venv/bin/python bench/refill.py [--quota 8 --max-refill-rounds 2 --cap 4 --trials 4000]

Each trial fills one rank's quota the way memagent.rl.dynamic_sampling.collect_groups does (the same
`refill_size`): the first round rolls out `quota` questions, each informative with probability p (its G scores
differ), and each refill asks for the smallest k whose expected informative groups minus `margin` binomial std
cover the missing ones, up to cap x the missing count, for at most max-refill-rounds refills. Reported per (p,
margin), averaged over trials: groups rolled out, rounds, groups short of the quota, and informative groups past
the quota (rolled out, then dropped: the waste a margin buys fewer rounds with). Uninformative groups are the
(1 - p) share of what is rolled out whatever the margin. No model: the cost of a rollout is proportional to the
groups rolled out, and each extra round adds the fixed cost of K + 1 generation calls.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

from memagent.rl.dynamic_sampling import refill_size  # noqa: E402


def simulate(p: float, margin: float, quota: int, max_refill_rounds: int, cap: float, trials: int,
             rng: np.random.Generator) -> tuple[float, float, float, float]:
    """(rolled, rounds, short, surplus) averaged over trials."""
    totals = np.zeros(4)
    for _ in range(trials):
        got = kept = rolled = rounds = surplus = 0
        while rounds <= max_refill_rounds:
            k = refill_size(quota - got, kept, rolled, cap, margin)
            if k == 0:
                break
            rounds += 1
            informative = int(rng.binomial(k, p))
            rolled, kept = rolled + k, kept + informative
            taken = min(informative, quota - got)
            got, surplus = got + taken, surplus + informative - taken
        totals += (rolled, rounds, quota - got, surplus)
    return tuple(totals / trials)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quota", type=int, default=8)
    parser.add_argument("--max-refill-rounds", type=int, default=2)
    parser.add_argument("--cap", type=float, default=4.0)
    parser.add_argument("--trials", type=int, default=4000)
    parser.add_argument("--keep-rates", type=float, nargs="+", default=[0.125, 0.25, 0.5, 0.75])
    parser.add_argument("--margins", type=float, nargs="+", default=[2.0, 1.0, 0.5, 0.0])
    args = parser.parse_args()
    print(f"quota {args.quota}, max_refill_rounds {args.max_refill_rounds}, cap {args.cap}, {args.trials} trials\n")
    print("| keep rate p | margin (std) | groups rolled out | rounds | short of quota | informative past quota |")
    print("|---|---|---|---|---|---|")
    for p in args.keep_rates:
        for margin in args.margins:
            rolled, rounds, short, surplus = simulate(p, margin, args.quota, args.max_refill_rounds, args.cap,
                                                      args.trials, np.random.default_rng(0))
            print(f"| {p} | {margin} | {rolled:.1f} | {rounds:.2f} | {short:.2f} | {surplus:.2f} |")


if __name__ == "__main__":
    main()
