"""The paper-scale presets: the DAPO recipe and MemAgent's released recipe differ exactly where they should."""

from __future__ import annotations

from memagent.config import preset_config


def test_memagent_release_preset_is_the_released_recipe() -> None:
    cfg = preset_config("memagent-release")
    lo, r = cfg.loss, cfg.rollout
    assert (lo.scale_by_std, lo.clip_low, lo.clip_high, lo.clip_c) == (False, 0.2, 0.2, 3.0)
    assert (lo.kl_coef, lo.kl_kind, lo.agg) == (0.001, "low_var_kl", "token-mean")
    assert not r.dynamic_sampling and not r.overlong_shaping
    assert (r.group_size, r.batch_size, r.top_p, r.temperature) == (16, 128, 1.0, 1.0)


def test_both_paper_presets_share_scale_and_differ_only_in_the_recipe() -> None:
    dapo, release = preset_config("qwen2.5-7b"), preset_config("memagent-release")
    assert dapo.workflow == release.workflow and dapo.optim == release.optim and dapo.data == release.data
    assert (dapo.loss.clip_high, dapo.loss.clip_c, dapo.loss.scale_by_std, dapo.loss.kl_coef) == (0.28, 10.0, True, 0.0)
    assert dapo.rollout.dynamic_sampling and dapo.rollout.overlong_shaping


def test_paper_warm_up_counts_twenty_rl_steps_of_optimizer_updates() -> None:
    cfg = preset_config("qwen2.5-7b")
    assert cfg.optim.warmup_steps == 20 * cfg.optim.mini_batches
