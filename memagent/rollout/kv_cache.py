"""A KV cache that writes each step in place instead of concatenating: the decode loop's cache.

Why. transformers' `DynamicLayer.update` does `keys = cat([keys, new], dim=-2)` at every decode step, so each step
reads and writes the whole cache once more. In MemAgent's rounds the cache is large next to the weights: SmolLM2-135M
holds 46 KB of K and V per token (30 layers x 2 x 3 KV heads x 64 dims x 4 bytes), so 8 rows of 800 tokens are
295 MB, copied at every step on top of the 540 MB of fp32 weights the step reads. `PreallocatedLayer` allocates
[b, heads, capacity, head_dim] once, on the first update (the prefill), copies each new slice into place and hands
attention a view of the first `length` positions: the per-step cost of the cache becomes the slice written.

It is a `DynamicLayer` in every other respect (no maximum length; mask sizes from the filled length), so the model's
mask building sees a dynamic cache. Dropping finished rows (`batch_select_indices`) and copying a shared prefill to its
rows (`reorder_cache`) index the buffer's batch dim, keeping the capacity. The engine knows the capacity exactly
(prompt width + max_new_tokens); an update past it raises rather than silently growing.
"""

from __future__ import annotations

import torch
from torch import Tensor
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


class PreallocatedLayer(DynamicLayer):
    """One attention layer's K and V in a buffer of fixed capacity, filled left to right.

    `keys` / `values` are [b, heads, length, head_dim] views of the buffers, exactly what a DynamicLayer would hold.
    """

    def __init__(self, capacity: int) -> None:
        super().__init__()
        if capacity < 1:
            raise ValueError(f"PreallocatedLayer: capacity={capacity} must be >= 1")
        self.capacity = capacity
        self.length = 0
        self.key_buffer: Tensor | None = None
        self.value_buffer: Tensor | None = None

    def lazy_initialization(self, key_states: Tensor, value_states: Tensor) -> None:
        batch, heads, _, _ = key_states.shape
        self.device = key_states.device
        self.key_buffer = key_states.new_empty((batch, heads, self.capacity, key_states.shape[-1]))
        self.value_buffer = value_states.new_empty((batch, value_states.shape[1], self.capacity, value_states.shape[-1]))
        self.length = 0
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


def preallocated_cache(config, capacity: int) -> DynamicCache:
    """A DynamicCache for `config` whose plain attention layers are `PreallocatedLayer`s of `capacity` positions.

    Layers of other kinds (sliding-window, linear attention) keep transformers' own implementation: a sliding
    window already bounds its cache, and their update rules differ.
    """
    cache = DynamicCache(config=config)
    cache.layers = [
        PreallocatedLayer(capacity) if type(layer) is DynamicLayer else layer for layer in cache.layers
    ]
    return cache
