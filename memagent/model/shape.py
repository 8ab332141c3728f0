"""A model's shape from its config.json, and the generation memory it implies: KV cache, prefill, rows per call.

No weights are read, so a run can be sized before launch (memagent.training.memory_budget) and a generate call can
size its batch (memagent.rollout.llm.LocalLLM with a KV-cache budget). First-order formulas:
- KV cache per token: 2 (K and V) * layers * kv_heads * head_dim * bytes per element.
- Prefill activations of one slice: the MLP's [tokens, intermediate] tensors (gate, up and their product, the
  largest live set of a layer) plus the residual stream, at the compute dtype; prefill runs without grad, so only
  one layer's activations are live at once.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

GIB = 1024**3
_REQUIRED = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")


@dataclass(frozen=True)
class ModelShape:
    """The config.json facts the estimates need."""

    hidden: int
    """hidden_size."""
    layers: int
    """num_hidden_layers."""
    heads: int
    """num_attention_heads."""
    kv_heads: int
    """num_key_value_heads (= heads without grouped-query attention)."""
    intermediate: int
    """intermediate_size of the MLP."""
    vocab: int
    """vocab_size (embedding rows)."""
    tied: bool
    """tie_word_embeddings: the output head shares the embedding matrix."""

    @property
    def head_dim(self) -> int:
        """Per-head width."""
        return self.hidden // self.heads

    @property
    def num_params(self) -> int:
        """Parameter count of a Qwen2/Llama-style decoder (attention with q/k/v biases, SwiGLU MLP, RMSNorms)."""
        kv = self.kv_heads * self.head_dim
        attention = self.hidden * self.hidden * 2 + self.hidden * kv * 2 + self.hidden + 2 * kv
        mlp = 3 * self.hidden * self.intermediate
        embeddings = self.vocab * self.hidden * (1 if self.tied else 2)
        return self.layers * (attention + mlp + 2 * self.hidden) + embeddings + self.hidden


def shape_from_config(config: dict, origin: str = "config.json") -> ModelShape:
    """The ModelShape of a config.json dict (or a loaded model's `config.to_dict()`); `origin` names it in errors."""
    missing = [key for key in _REQUIRED if key not in config]
    if missing:
        raise ValueError(f"{origin}: config.json lacks {missing}")
    return ModelShape(
        hidden=config["hidden_size"], layers=config["num_hidden_layers"], heads=config["num_attention_heads"],
        kv_heads=config.get("num_key_value_heads") or config["num_attention_heads"],
        intermediate=config["intermediate_size"], vocab=config["vocab_size"],
        tied=bool(config.get("tie_word_embeddings", False)),
    )


def read_shape(config_file: str | Path) -> ModelShape:
    """The ModelShape of a config.json (a file, or a model directory holding one)."""
    path = Path(config_file)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no config.json there; pass a model directory or a configs/*.config.json")
    return shape_from_config(json.loads(path.read_text()), str(path))


def kv_bytes_per_token(shape: ModelShape, dtype_bytes: int = 2) -> int:
    """Bytes of KV cache one token holds: 2 * layers * kv_heads * head_dim * dtype_bytes."""
    return 2 * shape.layers * shape.kv_heads * shape.head_dim * dtype_bytes


def prefill_activation_bytes(shape: ModelShape, rows: int, chunk_tokens: int, dtype_bytes: int = 2) -> int:
    """Peak no-grad activations of prefilling `rows` prompts in slices of `chunk_tokens` positions."""
    per_token = (3 * shape.intermediate + 4 * shape.hidden) * dtype_bytes
    return rows * chunk_tokens * per_token


def row_bytes(shape: ModelShape, tokens_per_row: int, chunk_tokens: int, dtype_bytes: int = 2) -> int:
    """What one generate row of `tokens_per_row` (prompt + new tokens) costs at most: its KV cache, all positions
    filled, plus one prefill slice of activations (`chunk_tokens`, 0 = the whole row at once)."""
    return kv_bytes_per_token(shape, dtype_bytes) * tokens_per_row + prefill_activation_bytes(
        shape, 1, min(chunk_tokens or tokens_per_row, tokens_per_row), dtype_bytes
    )


def rows_per_call(
    shape: ModelShape, budget_bytes: float, tokens_per_row: int, chunk_tokens: int, cap: int | None = None,
    dtype_bytes: int = 2,
) -> int:
    """How many rows of `tokens_per_row` (prompt + new tokens) one generate call may hold within `budget_bytes`
    of KV cache plus prefill activations (`row_bytes`); at least 1, at most `cap` when given."""
    if budget_bytes <= 0 or tokens_per_row < 1:
        raise ValueError(f"budget_bytes={budget_bytes} and tokens_per_row={tokens_per_row} must be positive")
    rows = max(1, int(budget_bytes // row_bytes(shape, tokens_per_row, chunk_tokens, dtype_bytes)))
    return min(rows, cap) if cap else rows


def tokens_per_row_within(shape: ModelShape, budget_bytes: float, chunk_tokens: int, dtype_bytes: int = 2) -> int:
    """The most tokens (prompt + new tokens) one row may hold with its `row_bytes` within `budget_bytes`; 0 when not
    even one token fits. A request longer than this cannot run within the budget even alone."""
    kv = kv_bytes_per_token(shape, dtype_bytes)
    activations = prefill_activation_bytes(shape, 1, 1, dtype_bytes)  # per token of a prefill slice
    whole = int(budget_bytes // (kv + activations))  # rows prefilled in one slice: both costs grow with the row
    if not chunk_tokens or whole <= chunk_tokens:
        return whole
    return int((budget_bytes - activations * chunk_tokens) // kv)  # past one slice, only the cache grows
