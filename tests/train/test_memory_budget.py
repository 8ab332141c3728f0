"""Memory estimates from config.json: the shipped Qwen2.5 facts, KV-cache bytes, rows per call, ZeRO partitioning."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from memagent.model import build_tiny_model, load_model
from memagent.training.memory_budget import (
    GIB,
    kv_bytes_per_token,
    prefill_activation_bytes,
    read_shape,
    rows_per_call,
    update_bytes,
)

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


@pytest.mark.parametrize(("name", "published_billions"), [("qwen2.5-7b-instruct", 7.62), ("qwen2.5-14b-instruct", 14.77)])
def test_shipped_qwen_configs_give_the_published_parameter_counts(name, published_billions):
    shape = read_shape(CONFIGS / f"{name}.config.json")
    assert shape.num_params / 1e9 == pytest.approx(published_billions, rel=0.01)


def test_parameter_count_matches_a_real_model_built_from_a_config(tmp_path):
    directory = build_tiny_model(tmp_path / "tiny")
    model = load_model(directory, dtype=torch.float32, device="cpu")
    assert read_shape(directory).num_params == sum(p.numel() for p in model.parameters())


def test_kv_cache_of_the_paper_batch_is_what_the_issue_measured():
    shape = read_shape(CONFIGS / "qwen2.5-7b-instruct.config.json")
    assert kv_bytes_per_token(shape) == 2 * 28 * 4 * 128 * 2
    assert 256 * 8192 * kv_bytes_per_token(shape) / 1e9 == pytest.approx(120.3, rel=0.01)  # OOM on one GPU


def test_rows_per_call_fit_the_budget_and_respect_the_cap():
    shape = read_shape(CONFIGS / "qwen2.5-7b-instruct.config.json")
    rows = rows_per_call(shape, 40 * GIB, tokens_per_row=8192, chunk_tokens=1024)
    one_row = kv_bytes_per_token(shape) * 8192 + prefill_activation_bytes(shape, rows=1, chunk_tokens=1024)
    assert rows * one_row <= 40 * GIB < (rows + 1) * one_row
    assert rows_per_call(shape, 40 * GIB, 8192, 1024, cap=16) == 16
    assert rows_per_call(shape, 1.0, 8192, 1024) == 1
    with pytest.raises(ValueError, match="budget_bytes"):
        rows_per_call(shape, 0, 8192, 1024)


def test_zero_stages_partition_more_state_as_they_go_up():
    shape = read_shape(CONFIGS / "qwen2.5-7b-instruct.config.json")
    kw = dict(world_size=8, micro_batch_tokens=8192, gradient_checkpointing=True)
    totals = [update_bytes(shape, zero_stage=z, **kw)["total"] for z in range(4)]
    assert totals == sorted(totals, reverse=True) and len(set(totals)) == 4
    single = update_bytes(shape, world_size=1, zero_stage=3, micro_batch_tokens=8192, gradient_checkpointing=True)
    assert single["params"] + single["grads"] + single["adam"] == shape.num_params * 18
    no_ckpt = update_bytes(shape, zero_stage=3, **{**kw, "gradient_checkpointing": False})
    assert no_ckpt["activations"] > update_bytes(shape, zero_stage=3, **kw)["activations"]


def test_missing_config_names_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match=str(tmp_path)):
        read_shape(tmp_path)


def _gib(text: str, phase: str) -> float:
    line = next(line for line in text.splitlines() if line.startswith(f"{phase}:"))
    return float(line.split()[1])


def test_dry_run_prints_per_gpu_memory_of_the_paper_preset_without_building_anything(tmp_path, capsys):
    from memagent import train

    out = tmp_path / "out"
    base = ["--preset", "qwen2.5-7b", "--output-dir", str(out), "--dry-run", "--deepspeed",
            str(CONFIGS / "ds_zero3.json")]
    assert train.main([*base, "--dry-run-world-size", "1"]) == {}
    one = capsys.readouterr().out
    train.main([*base, "--dry-run-world-size", "8"])
    eight = capsys.readouterr().out
    assert "ZeRO-3" in eight and "world size 8" in eight
    assert _gib(eight, "update") < _gib(one, "update") / 3  # ZeRO-3 partitions 18 bytes per parameter over 8
    shape = read_shape(CONFIGS / "qwen2.5-7b-instruct.config.json")
    full = update_bytes(shape, world_size=8, zero_stage=3, micro_batch_tokens=16384, gradient_checkpointing=True)
    assert _gib(eight, "update") == pytest.approx(full["total"] / GIB, abs=0.06)
    assert _gib(eight, "rollout") < 80  # the preset's KV-cache budget keeps generation on one 80 GB GPU
    assert not out.exists()


def test_dry_run_of_an_unknown_hub_id_names_the_field(tmp_path):
    from memagent import train

    with pytest.raises(FileNotFoundError, match="model.path='org/unknown'"):
        train.main(["--preset", "qwen2.5-7b", "--model.path", "org/unknown", "--dry-run", "--output-dir", str(tmp_path)])
