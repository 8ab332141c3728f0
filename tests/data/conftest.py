"""Fixtures of the data tests: the tiny model's tokenizer, loaded once (the generators only read it)."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import PreTrainedTokenizerBase

from memagent.model import load_tokenizer


@pytest.fixture(scope="session")
def tokenizer(tiny_model_dir: Path) -> PreTrainedTokenizerBase:
    """The tiny model's 512-token byte-level BPE, shared by every data test (and hypothesis example)."""
    return load_tokenizer(tiny_model_dir)
