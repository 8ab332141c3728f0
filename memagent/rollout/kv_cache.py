"""A KV cache that writes each step in place instead of concatenating, in a buffer that grows in blocks.

Why in place. transformers' `DynamicLayer.update` does `keys = cat([keys, new], dim=-2)` at every decode step, so each
step reads and writes the whole cache once more. In MemAgent's rounds the cache is large next to the weights:
SmolLM2-135M holds 46 KB of K and V per token (30 layers x 2 x 3 KV heads x 64 dims x 4 bytes), so 8 rows of 800
tokens are 295 MB, copied at every step on top of the 540 MB of fp32 weights the step reads. `PreallocatedLayer`
copies each new slice into a buffer and hands attention a view of the first `length` positions: the per-step cost of
the cache becomes the slice written.

Why in blocks. A buffer of the call's final size (prompt width + the largest max_new_tokens) is paid in full by
every row whether it generates one token or all of them: 16 rows asking for 50000 tokens and stopping after one
held 391 MB of cache on the tiny model, 3127 MB on a hidden-256 one (BENCHMARKS.md, "KV-cache memory"). The buffer
starts at `reserve` positions (the engine passes the prompt width plus one block) and grows by `GROW_BLOCK` positions
when a write would pass its end, never past `capacity`: a row that stops early costs at most a block beyond what it
used, and the buffer never exceeds what a budget of `capacity` positions assumed. Growing copies the layer once
every `GROW_BLOCK` steps, less than one decode step's read of the cache per step; layers grow one at a time (each
in its own `update`), so the copy holds one layer's old buffer, not the whole cache's, beside the new one.

It is a `DynamicLayer` in every other respect (mask sizes from the filled length), so the model's mask building sees
a dynamic cache. Dropping finished rows (`batch_select_indices`) and copying a shared prefill to its rows
(`reorder_cache`) index the buffer's batch dim, keeping its current size. An update past `capacity` raises rather
than silently growing beyond what the caller sized.
"""

from __future__ import annotations

import torch
from torch import Tensor
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

GROW_BLOCK = 256
"""Positions a full buffer grows by. Small next to long generations (8K tokens: 32 copies of the layer), large
enough that the copies cost little next to the decode steps between them."""


class PreallocatedLayer(DynamicLayer):
    """One attention layer's K and V in a buffer filled left to right, grown in blocks up to `capacity` positions.

    `keys` / `values` are [b, heads, length, head_dim] views of the buffers, exactly what a DynamicLayer would hold;
    the buffers are [b, heads, allocated, head_dim] with length <= allocated <= capacity.
    """

    def __init__(self, capacity: int, reserve: int | None = None, block: int = GROW_BLOCK) -> None:
        """capacity: most positions the layer may hold. reserve: positions of the first buffer (default: capacity,
        one buffer of the final size); the first update's own length if that is more. block: growth step."""
        super().__init__()
        if capacity < 1 or block < 1:
            raise ValueError(f"PreallocatedLayer: capacity={capacity} and block={block} must be >= 1")
        self.capacity = capacity
        self.reserve = capacity if reserve is None else min(reserve, capacity)
        self.block = block
        self.length = 0
        self.key_buffer: Tensor | None = None
        self.value_buffer: Tensor | None = None

    @property
    def allocated(self) -> int:
        """Positions the buffers hold now (0 before the first update)."""
        return 0 if self.key_buffer is None else self.key_buffer.shape[2]

    def _allocate(self, key_like: Tensor, value_like: Tensor, positions: int) -> None:
        """Replace the buffers by ones of `positions` positions holding the filled ones (a copy when there are)."""
        batch, heads, _, key_dim = key_like.shape
        keys = key_like.new_empty((batch, heads, positions, key_dim))
        values = value_like.new_empty((batch, value_like.shape[1], positions, value_like.shape[-1]))
        if self.length > 0:
            keys[:, :, : self.length].copy_(self.key_buffer[:, :, : self.length])
            values[:, :, : self.length].copy_(self.value_buffer[:, :, : self.length])
        self.key_buffer, self.value_buffer = keys, values

    def lazy_initialization(self, key_states: Tensor, value_states: Tensor) -> None:
        self.device = key_states.device
        self.length = 0
        self.key_buffer = self.value_buffer = None
        self._allocate(key_states, value_states, max(self.reserve, min(key_states.shape[-2], self.capacity)))
        self.is_initialized = True

    def update(self, key_states: Tensor, value_states: Tensor, *args, **kwargs) -> tuple[Tensor, Tensor]:
        """Write [b, heads, n, head_dim] new states after the filled ones; return views of all filled positions."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start, end = self.length, self.length + key_states.shape[-2]
        if end > self.capacity:
            raise RuntimeError(
                f"PreallocatedLayer: {end} positions exceed the capacity of {self.capacity} "
                "(the engine sizes it as prompt width + max_new_tokens)"
            )
        if end > self.allocated:
            grown = min(self.capacity, max(end, self.allocated + self.block))
            self._allocate(self.key_buffer, self.value_buffer, grown)
        self.key_buffer[:, :, start:end].copy_(key_states)
        self.value_buffer[:, :, start:end].copy_(value_states)
        self.length = end
        self.keys = self.key_buffer[:, :, :end]
        self.values = self.value_buffer[:, :, :end]
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def _select_rows(self, indices: Tensor) -> None:
        if self.is_initialized and self.length > 0:
            indices = indices.to(self.key_buffer.device)
            self.key_buffer = self.key_buffer.index_select(0, indices)
            self.value_buffer = self.value_buffer.index_select(0, indices)
            self.keys = self.key_buffer[:, :, : self.length]
            self.values = self.value_buffer[:, :, : self.length]

    def batch_select_indices(self, indices: Tensor) -> None:
        """Keep the rows `indices` ([b'] long), in that order."""
        self._select_rows(indices)

    def reorder_cache(self, beam_idx: Tensor) -> None:
        """Rows become rows `beam_idx` ([b'] long; repeats copy a row), as for a shared prefill."""
        self._select_rows(beam_idx)

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.is_initialized and self.length > 0:
            rows = torch.arange(self.key_buffer.shape[0], device=self.key_buffer.device)
            self._select_rows(rows.repeat_interleave(repeats))

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("PreallocatedLayer: crop is not used by the generation engine")

    def reset(self) -> None:
        self.key_buffer = self.value_buffer = None
        self.length = 0
        super().reset()


def cache_bytes(cache: DynamicCache) -> int:
    """Bytes of K and V the cache holds now: the whole buffers of `PreallocatedLayer`s (allocated, used or not),
    the tensors of other layers."""
    total = 0
    for layer in cache.layers:
        if isinstance(layer, PreallocatedLayer):
            tensors = (layer.key_buffer, layer.value_buffer)
        else:
            tensors = (getattr(layer, "keys", None), getattr(layer, "values", None))
        total += sum(t.nbytes for t in tensors if t is not None)
    return total


def preallocated_cache(config, capacity: int, reserve: int | None = None, block: int = GROW_BLOCK) -> DynamicCache:
    """A DynamicCache for `config` whose plain attention layers are `PreallocatedLayer(capacity, reserve, block)`s.

    Layers of other kinds (sliding-window, linear attention) keep transformers' own implementation: a sliding
    window already bounds its cache, and their update rules differ.
    """
    cache = DynamicCache(config=config)
    cache.layers = [
        PreallocatedLayer(capacity, reserve, block) if type(layer) is DynamicLayer else layer
        for layer in cache.layers
    ]
    return cache
