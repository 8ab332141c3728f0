"""Presets and the default preset: paper recipes differ where they should; the demo runs only when asked for."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from memagent.config import load_config, make_config, preset_config


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


def test_a_model_path_without_a_preset_gets_the_generic_defaults_and_no_warm_start() -> None:
    """The hazard of the old defaults: a user's model must never get the demo's warm start or learning rate."""
    cfg = load_config(["--model.path", "some/model", "--data.train-file", "train.json"])
    assert not cfg.demo.enabled
    assert cfg.optim.lr == 1e-6 and cfg.workflow.chunk_tokens == 5000 and cfg.rollout.group_size == 16
    assert cfg == make_config({"model": {"path": "some/model"}, "data": {"train_file": "train.json"}})


def test_a_model_path_in_a_config_file_also_selects_the_generic_defaults(tmp_path) -> None:
    file = tmp_path / "run.json"
    file.write_text('{"model": {"path": "some/model"}}')
    assert not load_config(["--config", str(file)]).demo.enabled


def test_no_model_path_runs_the_demo_preset() -> None:
    cfg = load_config([])
    assert cfg == preset_config("tiny") and cfg.demo.enabled and cfg.data.task == "code_lookup"


SMOLLM2_WINDOW = 8192
"""SmolLM2-135M-Instruct's max_position_embeddings (its config.json; the model itself is not in CI)."""


def test_smollm2_preset_trains_on_a_ruler_task_with_the_lenient_verifier_and_disjoint_heldout_seeds() -> None:
    cfg = preset_config("smollm2")
    assert cfg.rollout.verifier == "lenient" and not cfg.demo.enabled and cfg.data.task == "niah_single_1"
    assert cfg.rollout.overlong_cache_tokens < cfg.workflow.answer_tokens
    # make smollm2-rl scores the checkpoint with evaluate.py: another seed than the training questions, the
    # training length and 4x it, and the workflow budgets the model was trained with.
    makefile = (Path(__file__).parents[1] / "Makefile").read_text()
    flags = re.search(r"SMOLLM2_EVAL = (.*?)\n\S", makefile, re.DOTALL).group(1).replace("\\\n", " ").split()
    value = {flag: flags[i + 1] for i, flag in enumerate(flags) if flag.startswith("--")}
    assert int(value["--data-seed"]) != cfg.data.seed and value["--task"] == cfg.data.task
    train_length = cfg.data.train_chunks * cfg.workflow.chunk_tokens
    lengths = [int(x) for x in flags[flags.index("--lengths") + 1:] if x.isdigit()][:3]
    assert lengths[:2] == [train_length, 4 * train_length]
    assert lengths[2] > SMOLLM2_WINDOW  # one length beyond the window, where the full-context baseline truncates
    assert "--baseline full-context" in makefile
    assert (int(value["--chunk-tokens"]), int(value["--memory-tokens"]), int(value["--answer-tokens"])) == (
        cfg.workflow.chunk_tokens, cfg.workflow.memory_tokens, cfg.workflow.answer_tokens)
    # ... and the checkpoint it evaluates is the last one of the preset it trained (PRESET, smollm2 by default).
    assert re.search(r"^PRESET \?= smollm2$", makefile, re.MULTILINE)
    assert "train.py --preset $(PRESET)" in makefile
    assert f"$(SMOLLM2_RUN)/checkpoints/step_{cfg.run.steps:06d}/model" in makefile


def test_smollm2_release_preset_is_the_smollm2_recipe_under_memagent_released_loss() -> None:
    ours, release, paper = preset_config("smollm2"), preset_config("smollm2-release"), preset_config("memagent-release")
    assert release.loss == paper.loss and release.loss != ours.loss
    assert not release.rollout.dynamic_sampling and not release.rollout.overlong_shaping
    assert (release.workflow, release.data, release.optim, release.model) == (ours.workflow, ours.data, ours.optim,
                                                                              ours.model)
    assert release.run.steps == ours.run.steps and release.run.output_dir != ours.run.output_dir


def test_smollm2_mix_preset_trains_the_issue_task_mix_and_make_scores_it_with_its_own_budgets() -> None:
    from memagent.config.presets import MIX_HELDOUT_TASKS, MIX_TRAIN_TASKS, MIX_WEIGHTS
    from memagent.data.mix import parse_task_mix

    cfg, single = preset_config("smollm2-mix"), preset_config("smollm2")
    shares = parse_task_mix(cfg.data.tasks)
    assert [(s.name, s.weight) for s in shares] == list(zip(MIX_TRAIN_TASKS, MIX_WEIGHTS))
    assert not set(MIX_TRAIN_TASKS) & set(MIX_HELDOUT_TASKS)
    assert cfg.rollout.verifier == "task" and (cfg.optim, cfg.model) == (single.optim, single.model)
    # the overlong ramp would start inside a complete four-value answer (v0 of this recipe, docs/evaluation.md)
    assert not cfg.rollout.overlong_shaping
    # temperature-1 samples of the 135M model almost never hold the answer (v1 of this recipe, docs/evaluation.md)
    assert 0 < cfg.rollout.temperature < single.rollout.temperature
    makefile = (Path(__file__).parents[1] / "Makefile").read_text()
    listed = {name: re.search(rf"^{name} := (.*)$", makefile, re.MULTILINE).group(1).split()
              for name in ("MIX_TRAIN_TASKS", "MIX_HELDOUT_TASKS", "MIX_SHORT", "MIX_LONG")}
    assert listed["MIX_TRAIN_TASKS"] == list(MIX_TRAIN_TASKS) and listed["MIX_HELDOUT_TASKS"] == list(MIX_HELDOUT_TASKS)
    train_length = cfg.data.train_chunks * cfg.workflow.chunk_tokens
    assert [int(x) for x in listed["MIX_SHORT"] + listed["MIX_LONG"]] == [f * train_length for f in (1, 4, 16, 64)]
    flags = re.search(r"MIX_EVAL = (.*?)\n\S", makefile, re.DOTALL).group(1).replace("\\\n", " ").split()
    value = {flag: flags[i + 1] for i, flag in enumerate(flags) if flag.startswith("--")}
    assert int(value["--data-seed"]) != cfg.data.seed and int(value["--num-samples"]) >= 48
    assert (int(value["--chunk-tokens"]), int(value["--memory-tokens"]), int(value["--answer-tokens"])) == (
        cfg.workflow.chunk_tokens, cfg.workflow.memory_tokens, cfg.workflow.answer_tokens)
    assert f"$(MIX_RUN)/checkpoints/step_{cfg.run.steps:06d}/model" in makefile
    # make smollm2-mix-gates: the gated preset's last checkpoint, scored in its own workflow on the same cells
    gated = preset_config("smollm2-mix-gates")
    assert f"$(GATES_RUN)/checkpoints/step_{gated.run.steps:06d}/model" in makefile
    assert "GATES_PRESET ?= smollm2-mix-gates\n" in makefile and "--preset $(GATES_PRESET)" in makefile
    assert "GATES_PREFIX = $(patsubst smollm2-mix-%,%,$(GATES_PRESET))" in makefile  # gates, gates-cost
    assert "GATES_ROW = $(GATES_PREFIX)-seed$(SEED)" in makefile and "--gated-rows $(GATES_PREFIX)" in makefile
    # the read-cost variant (GATES_PRESET=smollm2-mix-gates-cost): same recipe, longer documents, a read cost
    cost = preset_config("smollm2-mix-gates-cost")
    assert cost.rollout.read_cost > 0 and cost.data.train_chunks > gated.data.train_chunks
    assert cost.rollout.filter_on == "reward" and gated.rollout.filter_on == "correct"  # the read cost gets a gradient
    assert (cost.workflow, cost.optim, cost.run.steps) == (gated.workflow, gated.optim, gated.run.steps)
    # ... which starts from the ungated seed's trained policy, not the base model
    assert ("GATES_FROM = $(if $(GATES_LORA),--model.lora-init $(LORA_SEED_ADAPTER),"
            "$(if $(filter smollm2-mix-gates-cost,$(GATES_PRESET)),--model.path $(MIX_RL)))") in makefile
    assert "$(GATES_FROM) --run.output-dir $(GATES_RUN)" in makefile
    # the LoRA grid: the mix recipe but for the adapters and their learning rate; its read-cost run starts from the
    # LoRA seed's kept adapter file
    lora, lora_cost = preset_config("smollm2-mix-lora"), preset_config("smollm2-mix-lora-gates-cost")
    assert lora.model.lora_rank > 0 and lora.optim.lr > cfg.optim.lr
    assert dataclasses.replace(lora, model=cfg.model, optim=cfg.optim, run=cfg.run) == dataclasses.replace(
        cfg, run=cfg.run)
    assert (lora_cost.model, lora_cost.optim) == (lora.model, lora.optim)
    assert (lora_cost.data, lora_cost.workflow) == (cost.data, cost.workflow)
    # ... with its decisions explored and advantages R - mean (docs/gates.md, "Exploring the decisions")
    assert dataclasses.replace(lora_cost.rollout, gate_explore=0.0) == cost.rollout and lora_cost.rollout.gate_explore > 0
    assert dataclasses.replace(lora_cost.loss, scale_by_std=True) == cost.loss and not lora_cost.loss.scale_by_std
    # the update gate alone: the LoRA recipe on 4-chunk documents with its decisions explored, no cost; its cells
    # are scored in its own workflow (--gates update)
    lora_update = preset_config("smollm2-mix-lora-gates-update")
    assert (lora_update.workflow.gates, lora_update.data.train_chunks) == ("update", cost.data.train_chunks)
    assert lora_update.rollout.gate_explore > 0 and lora_update.rollout.write_cost > 0
    assert lora_update.rollout.read_cost == 0 and lora_update.rollout.filter_on == "correct"  # no blind KEEP paid
    assert dataclasses.replace(lora_update, workflow=lora.workflow, data=lora.data, run=lora.run, rollout=dataclasses.replace(
        lora_update.rollout, gate_explore=0.0, write_cost=0.0)) == lora
    assert "GATES_MODE = $(if $(filter %-gates-update,$(GATES_PRESET)),update,both)" in makefile
    assert "$(GATES_ROW),--baseline none --gates $(GATES_MODE)" in makefile
    assert "LORA_SEED_ADAPTER = docs/results/adapters/smollm2-mix-lora-seed$(SEED).safetensors" in makefile
    assert "MIX_ADAPTER = docs/results/adapters/$(MIX_PRESET)-seed$(SEED).safetensors" in makefile
