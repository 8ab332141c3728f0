"""The offline loader: helpful errors, dtype/device handling, RoPE overrides, gradient checkpointing."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from memagent.model import load_model, load_tokenizer, loading
from memagent.model.loading import resolve_device, resolve_dtype
from memagent.model.precision import device_supports_bf16


def test_missing_directory_says_what_to_pass(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="make smollm2") as info:
        load_model(tmp_path / "nope")
    assert "memagent.model.tiny" in str(info.value)


def test_hub_id_is_refused_as_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="hub id.*offline.*make smollm2"):
        load_model("Qwen/Qwen2.5-7B-Instruct")
    with pytest.raises(ValueError, match="hub id"):
        load_tokenizer("HuggingFaceTB/SmolLM2-135M-Instruct")


def test_directory_without_config_is_refused(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_model(tmp_path / "empty")


def test_file_instead_of_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "f.bin").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match="is a file"):
        load_model(tmp_path / "f.bin")


@pytest.mark.parametrize(
    ("arg", "expected"),
    [
        (None, torch.float32),
        ("float32", torch.float32),
        ("bfloat16", torch.bfloat16),
        ("float16", torch.float16),
        (torch.bfloat16, torch.bfloat16),
    ],
)
def test_dtype_arguments_resolve_on_cpu(arg, expected: torch.dtype) -> None:
    assert resolve_dtype(arg, torch.device("cpu")) == expected


@pytest.mark.parametrize("native_bf16", [True, False])
def test_auto_dtype_is_bfloat16_only_where_bf16_is_native(monkeypatch, native_bf16: bool) -> None:
    # On an AVX2-only CPU bf16 is emulated (several times slower than fp32): "auto" must not pick it there.
    monkeypatch.setattr(loading, "device_supports_bf16", lambda device: native_bf16)
    expected = torch.bfloat16 if native_bf16 else torch.float32
    assert resolve_dtype("auto", torch.device("cpu")) == expected


def test_auto_dtype_follows_this_machines_bf16_support() -> None:
    expected = torch.bfloat16 if device_supports_bf16(torch.device("cpu")) else torch.float32
    assert resolve_dtype("auto", torch.device("cpu")) == expected


def test_unknown_dtype_is_refused() -> None:
    with pytest.raises(ValueError, match="dtype='fp8'"):
        resolve_dtype("fp8", torch.device("cpu"))


def test_default_device_is_cuda_only_when_available() -> None:
    assert resolve_device(None).type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_device("cpu") == torch.device("cpu")


def test_bfloat16_load_casts_every_parameter(tiny_model_dir: Path) -> None:
    model = load_model(tiny_model_dir, dtype="bfloat16", device="cpu")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert {p.device.type for p in model.parameters()} == {"cpu"}


def test_rope_scaling_override_appears_in_config_and_keeps_theta(tiny_model_dir: Path) -> None:
    base = load_model(tiny_model_dir, device="cpu")
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024}
    model = load_model(tiny_model_dir, device="cpu", rope_scaling=yarn)
    params = model.config.rope_parameters
    assert params["rope_type"] == "yarn" and params["factor"] == 4.0
    assert params["original_max_position_embeddings"] == 1024
    assert params["rope_theta"] == base.config.rope_parameters["rope_theta"]
    ids = torch.arange(1, 40).unsqueeze(0)
    with torch.no_grad():
        assert not torch.allclose(model(ids).logits, base(ids).logits)


def test_rope_scaling_without_type_is_refused(tiny_model_dir: Path) -> None:
    with pytest.raises(ValueError, match="rope_type"):
        load_model(tiny_model_dir, device="cpu", rope_scaling={"factor": 2.0})


def test_gradient_checkpointing_keeps_gradients_and_disables_cache(tiny_model_dir: Path) -> None:
    plain = load_model(tiny_model_dir, device="cpu").train()
    ckpt = load_model(tiny_model_dir, device="cpu", gradient_checkpointing=True).train()
    assert ckpt.is_activation_checkpointing and not ckpt.config.use_cache
    ids = torch.arange(1, 17).unsqueeze(0)
    for m in (plain, ckpt):
        m(ids).logits.float().logsumexp(-1).sum().backward()
    for (name, p), q in zip(plain.named_parameters(), ckpt.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6, msg=name)


def test_tokenizer_pad_falls_back_to_eos(tiny_model_dir: Path, tmp_path: Path) -> None:
    tok = load_tokenizer(tiny_model_dir)
    tok.pad_token = None
    tok.save_pretrained(tmp_path / "tok")
    reloaded = load_tokenizer(tmp_path / "tok")
    assert reloaded.pad_token == reloaded.eos_token == "<|im_end|>"
    assert reloaded.padding_side == "left"


def test_left_padding_puts_pads_first(tiny_tokenizer) -> None:
    batch = tiny_tokenizer(["a", "a much longer text"], padding=True, return_tensors="pt")
    mask = batch["attention_mask"]
    assert mask[0, 0] == 0 and mask[0, -1] == 1 and bool(mask[1].all())
    assert batch["input_ids"][0, 0] == tiny_tokenizer.pad_token_id
