"""The tiny offline model: deterministic, round-trips through the loader, and speaks ChatML like Qwen2.5."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from memagent.model import build_tiny_model, load_model, load_tokenizer
from memagent.model.tiny import DEFAULT_SYSTEM_PROMPT, main


def test_save_load_round_trip_is_bit_identical(tiny_model_dir: Path, tiny_model) -> None:
    saved = load_file(tiny_model_dir / "model.safetensors")
    loaded = tiny_model.state_dict()
    assert saved.keys() <= loaded.keys()
    for name, tensor in saved.items():
        assert torch.equal(loaded[name], tensor), name
    # Tied embeddings: the head is the embedding table, not a copy.
    assert tiny_model.lm_head.weight.data_ptr() == tiny_model.model.embed_tokens.weight.data_ptr()


def test_same_seed_gives_same_bytes_and_other_seed_differs(tmp_path: Path, tiny_model_dir: Path) -> None:
    again = build_tiny_model(tmp_path / "again")
    other = build_tiny_model(tmp_path / "other", seed=1)
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (again / name).read_bytes() == (tiny_model_dir / name).read_bytes(), name
    assert (other / "model.safetensors").read_bytes() != (again / "model.safetensors").read_bytes()


def test_build_leaves_global_rng_untouched(tmp_path: Path) -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    build_tiny_model(tmp_path / "m", seed=7)
    assert torch.equal(torch.rand(3), expected)


def test_config_special_ids_match_tokenizer(tiny_model, tiny_tokenizer) -> None:
    cfg = tiny_model.config
    assert tiny_tokenizer.eos_token == "<|im_end|>" and tiny_tokenizer.pad_token == "<|endoftext|>"
    assert cfg.eos_token_id == tiny_tokenizer.eos_token_id
    assert cfg.pad_token_id == tiny_tokenizer.pad_token_id
    assert cfg.vocab_size == len(tiny_tokenizer) == 512
    assert tiny_tokenizer.eos_token_id in tiny_model.generation_config.eos_token_id
    assert tiny_tokenizer.padding_side == "left"


@pytest.mark.parametrize(
    "text",
    [
        "Hello, world!",
        "naïve café – 東京 🙂",
        "  two  spaces\n\nand tabs\t",
        "The answer is \\boxed{42}.",
        "",
    ],
)
def test_decode_of_encode_is_identity_including_unicode(tiny_tokenizer, text: str) -> None:
    ids = tiny_tokenizer.encode(text, add_special_tokens=False)
    assert tiny_tokenizer.decode(ids) == text


def test_special_tokens_encode_to_single_ids(tiny_tokenizer) -> None:
    for token in ("<|endoftext|>", "<|im_start|>", "<|im_end|>"):
        assert len(tiny_tokenizer.encode(token, add_special_tokens=False)) == 1


def test_chat_template_is_chatml_with_default_system_and_generation_prompt(tiny_tokenizer) -> None:
    text = tiny_tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 2+2?"}], tokenize=False, add_generation_prompt=True
    )
    assert text == (
        f"<|im_start|>system\n{DEFAULT_SYSTEM_PROMPT}<|im_end|>\n"
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
    )


def test_chat_template_keeps_given_system_prompt_and_assistant_turns(tiny_tokenizer) -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."},
    ]
    text = tiny_tokenizer.apply_chat_template(messages, tokenize=False)
    assert (
        text == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello.<|im_end|>\n"
    )
    ids = tiny_tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"]
    assert tiny_tokenizer.decode(ids) == text


def test_too_small_corpus_is_refused_with_advice(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="larger corpus or a smaller vocab_size"):
        build_tiny_model(tmp_path / "m", corpus=["ab"], vocab_size=400)


def test_cli_writes_a_loadable_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    main(["--out", str(tmp_path / "cli"), "--hidden-size", "32", "--num-layers", "1"])
    assert "wrote tiny model" in capsys.readouterr().out
    model = load_model(tmp_path / "cli", device="cpu")
    assert model.config.hidden_size == 32 and model.config.num_hidden_layers == 1
    assert len(load_tokenizer(tmp_path / "cli")) == 512
