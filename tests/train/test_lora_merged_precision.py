"""A LoRA checkpoint's merged model/ over a bf16 base keeps the adapter update: it is saved in float32 unless the
caller asks for a narrower dtype, which then warns how much of the update rounding loses.

The update is set by hand to 0.1% of |W| per layer: bf16 keeps 8 bits of mantissa, so rounding W + update to bf16
loses most of such an update (about 80% of its norm), which made an evaluation of model/ score close to the base.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from memagent.model.lora import LoRALinear, apply_lora, lora_modules, rounding_loss
from memagent.training.checkpoint import save_model

RELATIVE_UPDATE = 1e-3
"""|update| / |W| of every adapted layer: the size of a few RL steps' LoRA update."""


def set_update(layer: LoRALinear, relative: float, generator: torch.Generator) -> None:
    """Random A and B scaled so that |(alpha / r) B A| = relative * |W| (Frobenius norms)."""
    with torch.no_grad():
        layer.lora_a.copy_(torch.randn(layer.lora_a.shape, generator=generator))
        layer.lora_b.copy_(torch.randn(layer.lora_b.shape, generator=generator))
        update = layer.scaling * layer.lora_b @ layer.lora_a
        layer.lora_b.mul_(relative * layer.base.weight.float().norm() / update.norm())


def update(layer: LoRALinear) -> torch.Tensor:
    """(alpha / r) B A in float64, [out, in]."""
    return layer.scaling * layer.lora_b.detach().double() @ layer.lora_a.detach().double()


def float32_rounding_bound(layer: LoRALinear) -> torch.Tensor:
    """Per element, a few float32 ulps of |W| + (alpha / r) |B| |A|: the rounding of the float32 matmul of rank r and
    of the sum, [out, in]. bf16 rounding is 2^-9 of |W|, 4000 times larger."""
    magnitude = layer.base.weight.double().abs() + layer.scaling * layer.lora_b.detach().double().abs() @ \
        layer.lora_a.detach().double().abs()
    return magnitude * 2.0 ** -21


@pytest.fixture
def bf16_adapted(tiny_model: torch.nn.Module) -> torch.nn.Module:
    """The tiny model with a bf16 base and an update of RELATIVE_UPDATE * |W| on every projection."""
    model = apply_lora(tiny_model.to(torch.bfloat16), rank=4, alpha=8.0)
    generator = torch.Generator().manual_seed(0)
    for layer in lora_modules(model).values():
        set_update(layer, RELATIVE_UPDATE, generator)
    return model


def lost_fraction(saved: dict[str, torch.Tensor], model: torch.nn.Module) -> float:
    """|saved - (W + update)| / |update| over all adapted layers, computed in float64."""
    error = total = 0.0
    for name, layer in lora_modules(model).items():
        delta = update(layer)
        error += float((saved[f"{name}.weight"].double() - layer.base.weight.double() - delta).square().sum())
        total += float(delta.square().sum())
    return (error / total) ** 0.5


def test_merged_weights_of_a_bf16_base_equal_base_plus_update_in_float32(bf16_adapted, tiny_tokenizer,
                                                                         tmp_path: Path) -> None:
    save_model(bf16_adapted, tiny_tokenizer, tmp_path)
    saved = load_file(str(tmp_path / "model" / "model.safetensors"))
    assert {t.dtype for t in saved.values()} == {torch.float32}
    for name, layer in lora_modules(bf16_adapted).items():
        exact = layer.base.weight.double() + update(layer)
        assert ((saved[f"{name}.weight"].double() - exact).abs() <= float32_rounding_bound(layer)).all(), name
    assert lost_fraction(saved, bf16_adapted) < 1e-3


def test_merged_model_loads_in_float32_by_default(bf16_adapted, tiny_tokenizer, tmp_path: Path) -> None:
    save_model(bf16_adapted, tiny_tokenizer, tmp_path)
    assert json.loads((tmp_path / "model" / "config.json").read_text())["dtype"] == "float32"
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "model", local_files_only=True)
    assert merged.dtype == torch.float32


def test_tied_embeddings_stay_tied_in_the_float32_merged_model(bf16_adapted, tiny_tokenizer, tmp_path: Path) -> None:
    assert bf16_adapted.config.tie_word_embeddings, "the tiny model ties its output head to the embedding"
    save_model(bf16_adapted, tiny_tokenizer, tmp_path)
    saved = load_file(str(tmp_path / "model" / "model.safetensors"))
    assert "lm_head.weight" not in saved
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "model", local_files_only=True)
    assert torch.equal(merged.lm_head.weight, bf16_adapted.lm_head.weight.float())


def test_a_bf16_merged_model_is_saved_on_request_with_a_warning_of_the_lost_update(bf16_adapted, tiny_tokenizer,
                                                                                   tmp_path: Path) -> None:
    expected = rounding_loss(bf16_adapted, torch.bfloat16)
    with pytest.warns(UserWarning, match=rf"bfloat16.* {100 * expected:.0f}% of the LoRA update.*adapter.safetensors"):
        save_model(bf16_adapted, tiny_tokenizer, tmp_path, merged_dtype=torch.bfloat16)
    saved = load_file(str(tmp_path / "model" / "model.safetensors"))
    assert {t.dtype for t in saved.values()} == {torch.bfloat16}
    assert lost_fraction(saved, bf16_adapted) == pytest.approx(expected, rel=1e-6)
    assert expected > 0.5, "an update of 0.1% of |W| is mostly lost in bf16"


def test_rounding_loss_is_negligible_in_float32_and_shrinks_with_larger_updates(bf16_adapted) -> None:
    assert rounding_loss(bf16_adapted, torch.float32) < 1e-3
    small = rounding_loss(bf16_adapted, torch.bfloat16)
    generator = torch.Generator().manual_seed(1)
    for layer in lora_modules(bf16_adapted).values():
        set_update(layer, 10 * RELATIVE_UPDATE, generator)
    assert rounding_loss(bf16_adapted, torch.bfloat16) < small
