"""The public API (docs/architecture.md): every name exists with the documented keyword names and defaults."""

from __future__ import annotations

import inspect

import pytest

import memagent.rl as rl
import memagent.rollout as rollout
import memagent.verify as verify

# (callable, {parameter: default}); inspect.Parameter.empty marks a required parameter.
REQUIRED = inspect.Parameter.empty
DESIGN_SIGNATURES = [
    (rl.group_advantages, {"rewards": REQUIRED, "group_ids": REQUIRED, "scale_by_std": True, "eps": 1e-6}),
    (rl.broadcast_to_conversations, {"values": REQUIRED, "conv_traj_index": REQUIRED}),
    (
        rl.policy_loss,
        {
            "logp": REQUIRED, "old_logp": REQUIRED, "advantages": REQUIRED, "mask": REQUIRED, "clip_low": 0.2,
            "clip_high": 0.28, "clip_c": 10.0, "agg": "token-mean", "num_tokens": None, "num_seqs": None,
            "norm_len": None,
        },
    ),
    (rl.kl_penalty, {"logp": REQUIRED, "ref_logp": REQUIRED, "kind": "k3"}),
    (rl.overlong_penalty, {"lengths": REQUIRED, "max_len": REQUIRED, "cache_len": REQUIRED, "factor": 1.0}),
    (rl.keep_informative_groups, {"rewards": REQUIRED, "group_ids": REQUIRED}),
    (
        rollout.generate,
        {"model": REQUIRED, "prompts": REQUIRED, "max_new_tokens": REQUIRED, "eos_token_id": REQUIRED},
    ),
]
VERIFY_NAMES = [
    "extract_boxed", "strict_reward", "normalize_answer", "exact_match", "f1_score", "sub_exact_match",
    "lenient_reward", "string_match_all", "string_match_part",
]


@pytest.mark.parametrize("fn, expected", DESIGN_SIGNATURES, ids=lambda x: getattr(x, "__name__", ""))
def test_design_signature_has_documented_parameters_and_defaults(fn, expected) -> None:
    params = inspect.signature(fn).parameters
    for name, default in expected.items():
        assert name in params, f"{fn.__name__} lacks parameter {name!r}"
        assert params[name].default == default, f"{fn.__name__}({name}=...) default {params[name].default!r}"


def test_policy_loss_knobs_are_keyword_only() -> None:
    params = inspect.signature(rl.policy_loss).parameters
    keyword_only = [n for n, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY]
    assert set(keyword_only) >= {"clip_low", "clip_high", "clip_c", "agg", "num_tokens", "num_seqs", "norm_len"}


@pytest.mark.parametrize("name", VERIFY_NAMES)
def test_verify_exports_design_name(name: str) -> None:
    assert callable(getattr(verify, name))


def test_sampling_params_defaults_are_plain_softmax_sampling() -> None:
    p = rollout.SamplingParams()
    assert (p.temperature, p.top_k, p.top_p, p.min_p) == (1.0, 0, 1.0, 0.0)


def test_generate_default_params_and_generator() -> None:
    params = inspect.signature(rollout.generate).parameters
    assert params["params"].default == rollout.SamplingParams()
    assert params["generator"].default is None
