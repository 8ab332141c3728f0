"""Shared fixtures: the tiny offline model, built once per test session and loaded through the real loader."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from memagent.model import build_tiny_model, load_model, load_tokenizer


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding the default tiny Qwen2 model and tokenizer (seed 0), written once per session."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture
def tiny_model(tiny_model_dir: Path) -> PreTrainedModel:
    """A fresh float32 CPU copy of the tiny model per test (eval mode), so a test may train it freely."""
    return load_model(tiny_model_dir, dtype=torch.float32, device="cpu")


@pytest.fixture
def tiny_tokenizer(tiny_model_dir: Path) -> PreTrainedTokenizerBase:
    """The tiny model's tokenizer (left padding, pad `<|endoftext|>`, eos `<|im_end|>`)."""
    return load_tokenizer(tiny_model_dir)
