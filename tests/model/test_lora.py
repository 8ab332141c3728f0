"""LoRA from scratch: zero-initialized adapters change nothing, merging is exact, only adapters train, and
adapter-only checkpoints restore exactly; merged weights load back as a plain HF checkpoint; bypassing the adapters
gives the base model exactly."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from memagent.model import load_model
from memagent.model.lora import (
    DEFAULT_TARGETS,
    AdaptersOff,
    LoRALinear,
    adapter_state_dict,
    apply_lora,
    load_adapter_state_dict,
    load_adapters,
    lora_modules,
    merge_lora,
    merged_state_dict,
    save_adapters,
)

IDS = torch.tensor([[5, 17, 99, 3, 250, 41, 7, 12], [8, 8, 300, 2, 19, 64, 111, 6]])


def logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=IDS).logits.double()


def randomize_adapters(model: torch.nn.Module, seed: int = 0) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in lora_modules(model).values():
            m.lora_b.copy_(torch.randn(m.lora_b.shape, generator=g) * 0.05)


def test_zero_initialized_adapter_leaves_outputs_unchanged(tiny_model) -> None:
    before = logits(tiny_model)
    apply_lora(tiny_model, rank=4, alpha=8.0)
    assert torch.equal(logits(tiny_model), before)


def test_every_attention_and_mlp_projection_is_adapted(tiny_model) -> None:
    layers = tiny_model.config.num_hidden_layers
    apply_lora(tiny_model, rank=2, alpha=2.0)
    names = {name.rsplit(".", 1)[-1] for name in lora_modules(tiny_model)}
    assert names == set(DEFAULT_TARGETS)
    assert len(lora_modules(tiny_model)) == layers * len(DEFAULT_TARGETS)


def test_merged_forward_equals_unmerged_forward(tiny_model) -> None:
    base = logits(tiny_model)
    apply_lora(tiny_model, rank=4, alpha=16.0)
    randomize_adapters(tiny_model)
    unmerged = logits(tiny_model)
    assert not torch.allclose(unmerged, base), "the random adapters must change the output"
    merge_lora(tiny_model)
    assert not lora_modules(tiny_model)
    torch.testing.assert_close(logits(tiny_model), unmerged, rtol=1e-5, atol=1e-5)


def test_only_adapter_parameters_receive_gradients(tiny_model) -> None:
    apply_lora(tiny_model, rank=4, alpha=8.0, target_modules=("q_proj", "v_proj"))
    randomize_adapters(tiny_model)
    tiny_model.train()
    tiny_model(input_ids=IDS, labels=IDS).loss.backward()
    trained = {n for n, p in tiny_model.named_parameters() if p.grad is not None}
    assert trained and all(n.endswith(("lora_a", "lora_b")) for n in trained)
    assert {n for n, p in tiny_model.named_parameters() if p.requires_grad} == trained
    assert all(float(p.grad.abs().sum()) > 0 for n, p in tiny_model.named_parameters() if n.endswith("lora_a"))


def test_adapter_only_checkpoint_restores_exactly(tiny_model, tiny_model_dir: Path, tmp_path: Path) -> None:
    apply_lora(tiny_model, rank=4, alpha=8.0)
    randomize_adapters(tiny_model, seed=3)
    save_file(adapter_state_dict(tiny_model), tmp_path / "adapter.safetensors")
    expected = logits(tiny_model)
    fresh = apply_lora(load_model(tiny_model_dir, dtype=torch.float32, device="cpu"), rank=4, alpha=8.0)
    load_adapter_state_dict(fresh, load_file(tmp_path / "adapter.safetensors"))
    assert torch.equal(logits(fresh), expected)


def test_adapter_checkpoint_of_another_rank_is_refused(tiny_model, tiny_model_dir: Path) -> None:
    apply_lora(tiny_model, rank=4, alpha=8.0)
    other = apply_lora(load_model(tiny_model_dir, dtype=torch.float32, device="cpu"), rank=2, alpha=8.0)
    with pytest.raises(ValueError, match="shape"):
        load_adapter_state_dict(other, adapter_state_dict(tiny_model))
    with pytest.raises(ValueError, match="missing"):
        load_adapter_state_dict(other, {})


def test_merged_model_saves_as_a_plain_hf_checkpoint(tiny_model, tmp_path: Path) -> None:
    apply_lora(tiny_model, rank=4, alpha=8.0)
    randomize_adapters(tiny_model, seed=1)
    expected = logits(tiny_model)
    merge_lora(tiny_model).save_pretrained(tmp_path / "merged")
    keys = load_file(tmp_path / "merged" / "model.safetensors").keys()
    assert not any("lora" in k for k in keys)
    reloaded = load_model(tmp_path / "merged", dtype=torch.float32, device="cpu")
    torch.testing.assert_close(logits(reloaded), expected, rtol=1e-5, atol=1e-5)


def test_unknown_target_module_is_refused(tiny_model) -> None:
    with pytest.raises(ValueError, match="match no nn.Linear"):
        apply_lora(tiny_model, rank=4, alpha=8.0, target_modules=("qproj",))


def test_bf16_base_keeps_float32_adapters(tiny_model) -> None:
    tiny_model.to(torch.bfloat16)
    apply_lora(tiny_model, rank=4, alpha=8.0)
    layer = next(iter(lora_modules(tiny_model).values()))
    assert isinstance(layer, LoRALinear)
    assert layer.lora_a.dtype == torch.float32 and layer.base.weight.dtype == torch.bfloat16
    out = tiny_model(input_ids=IDS).logits
    assert out.dtype == torch.bfloat16 and torch.isfinite(out.float()).all()


def test_one_unmatched_target_among_matching_ones_is_refused(tiny_model) -> None:
    with pytest.raises(ValueError, match=r"\['qproj'\] match no nn.Linear"):
        apply_lora(tiny_model, rank=4, alpha=8.0, target_modules=("v_proj", "qproj"))


def test_adapters_off_is_exactly_the_base_model_without_a_copy(tiny_model) -> None:
    base = logits(tiny_model)
    apply_lora(tiny_model, rank=4, alpha=8.0)
    randomize_adapters(tiny_model)
    adapted = logits(tiny_model)
    reference = AdaptersOff(tiny_model)
    assert torch.equal(logits(reference), base)
    assert torch.equal(logits(tiny_model), adapted), "the bypass ends with the forward"
    assert all(p.data_ptr() in {q.data_ptr() for q in tiny_model.parameters()} for p in reference.parameters())


def test_merged_state_dict_equals_merging_and_leaves_the_adapters_in_place(tiny_model, tiny_model_dir) -> None:
    apply_lora(tiny_model, rank=4, alpha=8.0)
    randomize_adapters(tiny_model, seed=2)
    state = merged_state_dict(tiny_model)
    assert len(lora_modules(tiny_model)) > 0
    other = apply_lora(load_model(tiny_model_dir, dtype=torch.float32, device="cpu"), rank=4, alpha=8.0)
    load_adapter_state_dict(other, adapter_state_dict(tiny_model))
    expected = merge_lora(other).state_dict()
    assert state.keys() == expected.keys() and all(torch.equal(state[k], expected[k]) for k in state)


def test_adapter_file_of_another_alpha_is_refused(tiny_model, tiny_model_dir: Path, tmp_path: Path) -> None:
    save_adapters(apply_lora(tiny_model, rank=4, alpha=8.0), tmp_path / "a.safetensors")
    other = apply_lora(load_model(tiny_model_dir, dtype=torch.float32, device="cpu"), rank=4, alpha=16.0)
    with pytest.raises(ValueError, match="alpha 8.0"):
        load_adapters(other, tmp_path / "a.safetensors")
