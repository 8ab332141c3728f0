"""Log-probs of rows that share a prompt prefix, with the prefix run through the decoder once.

In a MemAgent step many training rows begin alike: every conversation starts with the chat template and the
instruction paragraph, the G conversations of a group in one round also share the problem, and with the
section-first prompt (docs/workflow.md) the chunk too. For SmolLM2 at chunk 256 that is 440 of the ~500 prompt
tokens of a section-first memory row. `token_logprobs` runs the decoder over every row's whole prompt again;
here the shared prefix runs once as a one-row forward that fills a KV cache, the cache is repeated to the B rows,
and only the suffixes (the rest of each prompt, then the response) run through the decoder, attending to it.

Gradients: the repeated cache is part of the graph (repeat_interleave's backward sums over the rows), so every
row's loss reaches the prefix's keys and values, and through them the weights, exactly as in the plain forward:
the two equal up to float rounding (tests/model/test_shared_prefix.py checks log-probs and gradients).

What it asks of the caller:
- The prefix is prompt: no trained token lies in it, nor at the first suffix position, whose predictor is the
  prefix's last hidden state (not kept here), so position 0 of the result holds 0 as in `token_logprobs`.
- The suffixes are right-padded (each row's real tokens come first), so position ids simply continue the prefix.
- No gradient checkpointing: transformers' checkpointed decoder layers drop the cache in training mode.
- One process: the prefix is a second forward call per micro-batch, and ZeRO-3 gathers weights at every call,
  so ranks would have to agree on which micro-batches share a prefix (memagent.rl.step leaves sharing off there).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from transformers import DynamicCache

from memagent.model.logprobs import TokenLogprobs, head_logprobs


def shared_prefix_logprobs(
    model: nn.Module,
    prefix_ids: Tensor,
    input_ids: Tensor,
    attention_mask: Tensor,
    *,
    temperature: float = 1.0,
    chunk_tokens: int = 512,
    with_entropy: bool = False,
    target_mask: Tensor | None = None,
) -> TokenLogprobs:
    """Log-probs of `prefix_ids + input_ids[b]` for every row b, at the suffix positions.

    Args:
        model: an HF causal LM (not under gradient checkpointing; see the module docstring).
        prefix_ids: [P] long, P >= 1, the tokens every row starts with.
        input_ids: [B, S] long, each row's tokens after the prefix, right-padded.
        attention_mask: [B, S], 1 on real suffix tokens (a prefix of each row), 0 on the right padding.
        temperature, chunk_tokens, with_entropy, target_mask ([B, S] bool): as in `token_logprobs`.

    Returns:
        TokenLogprobs with [B, S] float32 tensors: position t (t >= 1) is log p(input_ids[b, t] | prefix,
        input_ids[b, <t]); position 0 and padding hold 0. Gradients flow into the model when grad mode is on.
    """
    if prefix_ids.dim() != 1 or prefix_ids.numel() == 0:
        raise ValueError(f"prefix_ids {tuple(prefix_ids.shape)}: pass a non-empty [P] tensor")
    if input_ids.dim() != 2 or attention_mask.shape != input_ids.shape:
        raise ValueError(
            f"input_ids {tuple(input_ids.shape)} and attention_mask {tuple(attention_mask.shape)}: pass two [B, S]"
        )
    inner = getattr(model, "module", model)
    checkpointing = getattr(inner, "is_activation_checkpointing", None)  # transformers >= 5.25; older: the other name
    if checkpointing is None:
        checkpointing = getattr(inner, "is_gradient_checkpointing", False)
    if checkpointing and inner.training:
        raise ValueError("shared_prefix_logprobs: gradient checkpointing drops the prefix's cache; use token_logprobs")
    B, S = input_ids.shape
    P = prefix_ids.numel()
    cache = DynamicCache(config=inner.config)
    model(input_ids=prefix_ids[None], cache=cache, use_cache=True, logits_to_keep=1)  # fills the cache, [1, P]
    cache.batch_repeat_interleave(B)  # [B, heads, P, head_dim] per layer, still in the graph
    mask = attention_mask.long()
    full_mask = torch.cat([mask.new_ones(B, P), mask], dim=1)  # [B, P + S]
    positions = torch.arange(P, P + S, device=input_ids.device).expand(B, S)  # right padding: real tokens first
    out = model(input_ids=input_ids, attention_mask=full_mask, position_ids=positions, cache=cache, use_cache=True,
                output_hidden_states=True, logits_to_keep=1)
    return head_logprobs(model, out.hidden_states[-1], input_ids, mask, temperature=temperature,
                         chunk_tokens=chunk_tokens, with_entropy=with_entropy, target_mask=target_mask)
