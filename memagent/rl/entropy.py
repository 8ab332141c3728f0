"""Per-token entropy of the policy's next-token distribution, from logits.

H = logsumexp(z) - sum_v softmax(z)_v z_v, which equals -sum p log p without forming log p (verl
`entropy_from_logits`). Pass logits already divided by the sampling temperature, the same ones the log-probs of
the loss come from. Chunking over T (to avoid a [B, T, V] float32 buffer) is the caller's job.
"""

from __future__ import annotations

import torch
from torch import Tensor


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy in nats of softmax(logits) along the last dimension.

    Args:
        logits: [..., V] float, finite (V >= 1); half precision is computed in float32.
    Returns:
        [...] entropies in [0, log V], in logits' dtype (float32 for float16 / bfloat16 input).
    """
    if logits.dim() < 1 or logits.shape[-1] < 1:
        raise ValueError(f"logits: expected shape [..., V] with V >= 1, got {tuple(logits.shape)}")
    if not logits.is_floating_point():
        raise ValueError(f"logits: expected a float tensor, got dtype {logits.dtype}")
    z = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    p = torch.softmax(z, dim=-1)
    return torch.logsumexp(z, dim=-1) - (p * z).sum(dim=-1)
