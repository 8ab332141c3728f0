"""Split a document into fixed-size token chunks of the policy tokenizer, streaming.

MemAgent chunks by token count with the policy's own tokenizer (`add_special_tokens=False`) at fixed offsets
[k*C, (k+1)*C), so a chunk may cut a word; each chunk is decoded to text (special tokens skipped) and
re-rendered inside the next prompt by the chat template, as MemAgent's async and eval modes do
(docs/workflow.md). Training caps a document at `max_chunks * C` tokens by center truncation (first half +
last half).

Memory. A 3.5M-token document must not cost more than its token ids: a document is tokenized once into an
int32 numpy array (4 bytes a token, 14 MB for 3.5M tokens) and chunks are decoded one at a time, on demand.
Long texts are tokenized in pieces of about `piece_chars` characters, because a fast tokenizer's full encoding
of one huge string (tokens, offsets, masks) costs far more than its ids. Pieces end right after a newline that
is followed by a non-space character: the pre-tokenizers of byte-level BPE tokenizers (GPT-2, Qwen2, Llama-3
style regexes) never join tokens across such a point, so piecewise ids equal whole-text ids for them. A
tokenizer that adds a prefix space to every call (SentencePiece with add_dummy_prefix) can differ slightly at
piece boundaries.

An empty document has zero chunks: the MemAgent agent then answers from its initial memory.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

PIECE_CHARS = 1 << 20
"""Characters per tokenizer call when tokenizing a long text (about 250k tokens of English)."""

# A piece boundary: just after a newline whose next character is not whitespace (see the module docstring).
_PIECE_BOUNDARY = re.compile(r"\n(?=\S)")

TokenIds = np.ndarray | torch.Tensor | Sequence[int]


def tokenize_document(
    text: str, tokenizer: PreTrainedTokenizerBase, *, piece_chars: int = PIECE_CHARS
) -> np.ndarray:
    """Token ids of `text` without special tokens: [T] int32, tokenized in pieces on line boundaries.

    Each piece is at least `piece_chars` characters long (the last one may be shorter) and ends after a
    newline followed by a non-space character; a text with no such newline is tokenized in one call.
    """
    if piece_chars < 1:
        raise ValueError(f"tokenize_document: piece_chars must be >= 1, got {piece_chars}")
    parts: list[np.ndarray] = []
    start = 0
    while start < len(text):
        boundary = _PIECE_BOUNDARY.search(text, start + piece_chars)
        end = boundary.end() if boundary else len(text)
        ids = tokenizer(text[start:end], add_special_tokens=False)["input_ids"]
        parts.append(np.asarray(ids, dtype=np.int32))
        start = end
    if not parts:
        return np.zeros(0, dtype=np.int32)
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def as_token_array(ids: TokenIds) -> np.ndarray:
    """Token ids as a 1-D int32 numpy array ([T]); a numpy int32 input is returned as is (no copy)."""
    if isinstance(ids, torch.Tensor):
        ids = ids.detach().cpu().numpy()
    array = np.asarray(ids, dtype=np.int32)
    if array.ndim != 1:
        raise ValueError(f"token ids must be 1-D, got shape {array.shape}")
    return array


def center_truncate(ids: TokenIds, max_tokens: int) -> np.ndarray:
    """Keep the first max_tokens // 2 and the last max_tokens - max_tokens // 2 ids.

    ids: [T] -> [min(T, max_tokens)] int32. MemAgent's training truncation (verl `truncation='center'`,
    docs/workflow.md): the middle of an over-long document is dropped. Ids already within the cap come back
    unchanged.
    """
    if max_tokens < 1:
        raise ValueError(f"center_truncate: max_tokens must be >= 1, got {max_tokens}")
    array = as_token_array(ids)
    if len(array) <= max_tokens:
        return array
    head = max_tokens // 2
    return np.concatenate([array[:head], array[len(array) - (max_tokens - head) :]])


def num_chunks(num_tokens: int, chunk_tokens: int) -> int:
    """ceil(num_tokens / chunk_tokens): how many chunks a document of num_tokens tokens has (0 when empty)."""
    if chunk_tokens < 1:
        raise ValueError(f"num_chunks: chunk_tokens must be >= 1, got {chunk_tokens}")
    return -(-num_tokens // chunk_tokens)


def iter_chunks(
    document: str | TokenIds, tokenizer: PreTrainedTokenizerBase, chunk_tokens: int, *, first: int = 0
) -> Iterator[str]:
    """Yield the decoded text of chunks [k*C, (k+1)*C) of a document, one at a time (special tokens skipped), from
    chunk `first` on (a resumed rollout skips the chunks it has read without decoding them).

    document: the text (tokenized once with `tokenize_document`) or its token ids. Nothing but the ids and the
    current chunk's text is held, so memory does not grow with the number of chunks.
    """
    ids = tokenize_document(document, tokenizer) if isinstance(document, str) else as_token_array(document)
    for k in range(first, num_chunks(len(ids), chunk_tokens)):
        yield tokenizer.decode(
            ids[k * chunk_tokens : (k + 1) * chunk_tokens].tolist(), skip_special_tokens=True
        )
