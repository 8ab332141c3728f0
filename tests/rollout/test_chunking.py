"""Chunking by policy-tokenizer token count, center truncation, and streaming memory use."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
import torch

from memagent.rollout.chunking import (
    as_token_array,
    center_truncate,
    iter_chunks,
    num_chunks,
    tokenize_document,
)

TEXT = (
    "The quick brown fox jumps over the lazy dog near the old mill.\n"
    "Document 12: the village had a school, a bakery and a library.\n\n"
    "  Indented line with   spaces, numbers 42, 3.14 and 1,000,000.\n"
    "Café, naïve, résumé – 🙂 东京.\n"
    "\n\n"
    'She said: "the key is under the blue stone"!\n'
) * 6


def test_chunks_are_fixed_token_offsets(tiny_tokenizer) -> None:
    ids = tokenize_document(TEXT, tiny_tokenizer)
    chunks = list(iter_chunks(ids, tiny_tokenizer, 37))
    assert len(chunks) == -(-len(ids) // 37)
    for k, chunk in enumerate(chunks):
        assert chunk == tiny_tokenizer.decode(ids[k * 37 : (k + 1) * 37].tolist())


def test_text_and_its_ids_give_the_same_chunks(tiny_tokenizer) -> None:
    ids = tiny_tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    assert list(iter_chunks(TEXT, tiny_tokenizer, 50)) == list(iter_chunks(ids, tiny_tokenizer, 50))
    assert list(iter_chunks(torch.tensor(ids), tiny_tokenizer, 50)) == list(
        iter_chunks(ids, tiny_tokenizer, 50)
    )


def test_ascii_chunks_concatenate_back_to_the_document(tiny_tokenizer) -> None:
    text = "Numbers like 42 and 7, words like river and memory.\nA second line follows here.\n" * 5
    assert "".join(iter_chunks(text, tiny_tokenizer, 13)) == text


def test_empty_document_has_zero_chunks(tiny_tokenizer) -> None:
    assert list(iter_chunks("", tiny_tokenizer, 100)) == []
    assert list(iter_chunks([], tiny_tokenizer, 100)) == []
    assert tokenize_document("", tiny_tokenizer).dtype == np.int32


def test_document_shorter_than_one_chunk_is_one_chunk(tiny_tokenizer) -> None:
    assert list(iter_chunks("A short document.", tiny_tokenizer, 5000)) == ["A short document."]


@pytest.mark.parametrize("piece_chars", [1, 10, 64, 1000])
def test_piecewise_tokenization_equals_whole_text_tokenization(tiny_tokenizer, piece_chars: int) -> None:
    whole = tiny_tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    pieces = tokenize_document(TEXT, tiny_tokenizer, piece_chars=piece_chars)
    assert pieces.dtype == np.int32
    assert pieces.tolist() == whole


@pytest.mark.parametrize("max_tokens", [6, 7])
def test_center_truncate_keeps_first_and_last_halves(max_tokens: int) -> None:
    ids = np.arange(20, dtype=np.int32)
    head = max_tokens // 2
    out = center_truncate(ids, max_tokens)
    assert out.tolist() == list(range(head)) + list(range(20 - (max_tokens - head), 20))


def test_center_truncate_leaves_ids_within_the_cap_unchanged() -> None:
    ids = np.arange(10, dtype=np.int32)
    assert center_truncate(ids, 10) is ids
    assert center_truncate([1, 2, 3], 8).tolist() == [1, 2, 3]


def test_num_chunks_is_the_ceiling() -> None:
    assert [num_chunks(n, 5) for n in (0, 1, 5, 6, 10, 11)] == [0, 1, 1, 2, 2, 3]


def test_token_arrays_are_int32_and_one_dimensional() -> None:
    assert as_token_array(torch.tensor([1, 2])).dtype == np.int32
    with pytest.raises(ValueError, match="1-D"):
        as_token_array(np.zeros((2, 2)))


def test_streaming_a_3_5m_token_document_holds_only_its_ids_and_one_chunk(tiny_tokenizer) -> None:
    ids = np.random.default_rng(0).integers(3, tiny_tokenizer.vocab_size, size=3_500_000).astype(np.int32)
    tracemalloc.start()
    count, longest = 0, 0
    for chunk in iter_chunks(ids, tiny_tokenizer, 5000):
        count += 1
        longest = max(longest, len(chunk))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert count == 700
    # One chunk's text and its id list (5000 Python ints) are all that is alive at a time: far below the 14 MB
    # of the ids themselves, let alone the ~100 MB that 700 decoded chunks would take.
    assert peak < 2_000_000, peak
    assert longest > 0
