"""The worked example of the README's RL-math section, recomputed by hand and by memagent.rl."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from memagent.rl import broadcast_to_conversations, group_advantages, policy_loss

ROOT = Path(__file__).resolve().parents[2]
REWARDS = [1.0, 0.0, 0.0, 0.0]
# (old_logp, logp) per token, per conversation (memory update, answer), per trajectory: the table of the example.
TOKENS = [
    [[(-1.2, -1.1), (-0.7, -0.7), (-2.0, -1.7)], [(-0.5, -0.5), (-0.1, -0.1)]],
    [[(-0.9, -1.2), (-1.5, -1.5)], [(-0.3, -0.2)]],
    [[(-2.2, -2.2), (-0.4, -0.5)], [(-0.8, -0.8), (-0.6, -0.6)]],
    [[(-1.0, -1.2)], [(-0.2, -0.2)]],
]
DOCUMENTED = {  # the numbers printed in the example
    "advantage_pos": 1.499997,
    "advantage_neg": -0.499999,
    "traj_sums": [-8.077740, 1.452583, 1.952415, 0.909364],
    "loss": -0.268813,
    "clipfrac": 0.142857,
    "approx_kl": 0.007143,
    "on_policy_loss": -0.214285,
    "memagent_loss": -0.130121,
}


def _hand_advantages(scale_by_std: bool) -> list[float]:
    mu = sum(REWARDS) / 4
    sigma = math.sqrt(sum((r - mu) ** 2 for r in REWARDS) / 3)
    return [(r - mu) / (sigma + 1e-6) if scale_by_std else r - mu for r in REWARDS]


def _hand_token_loss(rho: float, a: float, lo: float, hi: float, c: float) -> float:
    return -a * min(rho, 1 + hi) if a > 0 else abs(a) * min(max(rho, 1 - lo), c)


def _hand(scale_by_std: bool, lo: float, hi: float, c: float, on_policy: bool = False) -> dict[str, object]:
    adv = _hand_advantages(scale_by_std)
    sums, clipped, kl, n = [], 0, 0.0, 0
    for a, convs in zip(adv, TOKENS):
        s = 0.0
        for old, new in (tok for conv in convs for tok in conv):
            rho = 1.0 if on_policy else math.exp(new - old)
            s += _hand_token_loss(rho, a, lo, hi, c)
            clipped += (a > 0 and rho > 1 + hi) or (a < 0 and rho < 1 - lo)
            kl += old - new
            n += 1
        sums.append(s)
    return {"adv": adv, "traj_sums": sums, "loss": sum(sums) / n, "clipfrac": clipped / n, "approx_kl": kl / n}


def _implementation(scale_by_std: bool, lo: float, hi: float, c: float, on_policy: bool = False):
    convs = [(i, conv) for i, t in enumerate(TOKENS) for conv in t]
    width = max(len(conv) for _, conv in convs)
    old = torch.zeros(len(convs), width, dtype=torch.float64)
    new, mask = torch.zeros_like(old), torch.zeros_like(old)
    for r, (_, conv) in enumerate(convs):
        for t, (o, n) in enumerate(conv):
            old[r, t], new[r, t], mask[r, t] = o, n, 1.0
    adv = group_advantages(torch.tensor(REWARDS, dtype=torch.float64), torch.zeros(4, dtype=torch.long),
                           scale_by_std=scale_by_std)
    rows = broadcast_to_conversations(adv, torch.tensor([i for i, _ in convs]))
    loss, metrics = policy_loss(new, new if on_policy else old, rows, mask, clip_low=lo, clip_high=hi, clip_c=c)
    return adv, loss, metrics


def test_documented_numbers_match_hand_formula():
    hand = _hand(True, 0.2, 0.28, 10.0)
    assert math.isclose(hand["adv"][0], DOCUMENTED["advantage_pos"], abs_tol=1e-6)
    assert all(math.isclose(a, DOCUMENTED["advantage_neg"], abs_tol=1e-6) for a in hand["adv"][1:])
    for got, doc in zip(hand["traj_sums"], DOCUMENTED["traj_sums"]):
        assert math.isclose(got, doc, abs_tol=1e-6)
    for key in ("loss", "clipfrac", "approx_kl"):
        assert math.isclose(hand[key], DOCUMENTED[key], abs_tol=1e-6), key
    assert math.isclose(_hand(True, 0.2, 0.28, 10.0, on_policy=True)["loss"], DOCUMENTED["on_policy_loss"], abs_tol=1e-6)
    assert math.isclose(_hand(False, 0.2, 0.2, 3.0)["loss"], DOCUMENTED["memagent_loss"], abs_tol=1e-6)


@pytest.mark.parametrize(
    ("setting", "key"),
    [((True, 0.2, 0.28, 10.0, False), "loss"), ((True, 0.2, 0.28, 10.0, True), "on_policy_loss"),
     ((False, 0.2, 0.2, 3.0, False), "memagent_loss")],
)
def test_implementation_reproduces_documented_loss(setting, key):
    adv, loss, metrics = _implementation(*setting)
    assert math.isclose(float(loss), DOCUMENTED[key], abs_tol=1e-6)
    if setting[0]:
        assert math.isclose(float(adv[0]), DOCUMENTED["advantage_pos"], abs_tol=1e-6)
    if key == "loss":
        assert math.isclose(float(metrics.clipfrac), DOCUMENTED["clipfrac"], abs_tol=1e-6)
        assert math.isclose(float(metrics.approx_kl), DOCUMENTED["approx_kl"], abs_tol=1e-6)


def test_example_text_shows_the_documented_numbers():
    text = (ROOT / "README.md").read_text()
    assert "### Worked example" in text, "README.md has no worked example section"
    numbers = [v for k, v in DOCUMENTED.items() if k != "traj_sums"] + DOCUMENTED["traj_sums"]
    for x in numbers:
        shown = f"{x:.6f}".replace("-", "\u2212")
        assert shown in text, f"README.md does not show {shown}"
