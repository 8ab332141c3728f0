"""Per-token log-probabilities (and entropies) of a causal LM, without a [B, T, V] float32 log-softmax.

The policy-gradient loss needs log p(token_t | tokens_<t) for every sampled token. The naive way, `log_softmax(
model(ids).logits.float())`, builds a [B, T, V] float32 tensor (for Qwen2.5 at T = 8K that is 5 GB per row) and
keeps it alive for backward. Here the decoder runs once; the output head then runs over the flattened tokens in
chunks of `chunk_tokens`, each chunk going logits -> / temperature -> float32 log-softmax -> gather, under
`torch.utils.checkpoint` so backward recomputes a chunk's logits instead of storing them. The head's peak memory
is then a few [chunk_tokens, V] float32 tensors (logits, log-softmax and their gradients while one chunk is in
backward; bench/logprobs.md has measurements). Positions that are padding, a row's first real token (no prefix) or
outside `target_mask` are skipped and hold 0, so their head cost is not paid at all.

All chunks run inside ONE call of the head module (its forward is swapped for the chunk loop during the call), so
module hooks see one call per pass whatever the token count: under ZeRO-3 the head is gathered once per pass on
every rank, where one gather per chunk would be a different number of collectives on ranks with different tokens.

Temperature is applied exactly as the sampler applies it (logits / T in float32 after the head ran in the model's
dtype), so log-probs recomputed for training match the ones recorded at rollout.
Left padding is supported: position ids default to cumsum(mask) - 1, as in generation.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

# Config fields of HF models whose causal-LM head post-processes logits (Gemma2 softcapping, Cohere/Granite
# scaling): applying `get_output_embeddings()` alone would give the wrong distribution for them.
_LOGIT_POSTPROCESSING = ("final_logit_softcapping", "logit_scale", "logits_scaling")


@dataclass(frozen=True)
class TokenLogprobs:
    """Per-position log-probabilities and entropies of a batch of sequences."""

    logprobs: Tensor
    """[B, T] float32: log p(input_ids[:, t] | input_ids[:, <t]) at temperature T; 0 at padding, at each row's
    first real token (it has no prefix) and at positions outside `target_mask`."""
    entropy: Tensor | None
    """[B, T] float32 entropy of the distribution that predicts position t (same zeros), or None if not asked."""


def _output_head(model: nn.Module) -> nn.Module:
    """The output head of a (possibly DDP/DeepSpeed-wrapped) HF causal LM whose logits are just head(hidden)."""
    inner = getattr(model, "module", model)
    config = inner.config
    for name in _LOGIT_POSTPROCESSING:
        value = getattr(config, name, None)
        if value not in (None, 1.0):
            raise NotImplementedError(
                f"{type(inner).__name__} post-processes logits ({name}={value}); unsupported"
            )
    return inner.get_output_embeddings()


def _chunk_logprobs(
    head: nn.Module, hidden: Tensor, targets: Tensor, temperature: float, with_entropy: bool
) -> tuple[Tensor, Tensor]:
    """Log-prob of `targets` and entropy (or an empty tensor) for one chunk.

    hidden: [N, H] model dtype; targets: [N] long. Returns two [N] float32 tensors.
    """
    # [N, V] float32. Dividing in place saves one V-sized copy: the head's backward needs its input, not its output.
    logits = head(hidden).float().div_(temperature)
    # log_softmax keeps one [N, V] tensor for backward; logsumexp + gather measured ~1.5x more peak memory.
    logp_all = torch.log_softmax(logits, dim=-1)  # [N, V]
    logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    if not with_entropy:
        return logp, logp.new_empty(0)
    # H = -sum p log p, which equals logsumexp(z) - sum softmax(z) * z.
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy


def token_logprobs(
    model: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    *,
    temperature: float = 1.0,
    chunk_tokens: int = 512,
    with_entropy: bool = False,
    position_ids: Tensor | None = None,
    target_mask: Tensor | None = None,
) -> TokenLogprobs:
    """Log-probability of every token given its prefix, computed chunk by chunk over the head.

    Args:
        model: an HF causal LM (Qwen2, Llama, ...) or a DDP/DeepSpeed wrapper of one; called through its own
            forward (so wrappers' hooks run), with `logits_to_keep=1` so it computes no full logits itself.
        input_ids: [B, T] long.
        attention_mask: [B, T] (bool/int), 1 for real tokens; any padding (left or right) is 0.
        temperature: > 0; logits are divided by it before the softmax, as in sampling.
        chunk_tokens: how many (row, position) pairs go through the head at once; the head's memory is a few
            [chunk_tokens, V] float32 tensors, whatever B and T (Qwen2.5's V = 152K: about 0.3 GB each at 512).
        with_entropy: also return the entropy of each predictive distribution.
        position_ids: [B, T] long; default (cumsum(mask) - 1).clamp(min=0), which is what left-padded generation
            used.
        target_mask: [B, T] bool, optional: compute only these positions (e.g. the response tokens); the rest
            hold 0. Padding positions are always skipped.

    Returns:
        TokenLogprobs with [B, T] float32 tensors; gradients flow into the model when grad mode is on.
    """
    if temperature <= 0:
        raise ValueError(f"temperature={temperature}: pass a value > 0 (greedy decoding has no log-probs)")
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens={chunk_tokens}: pass a positive number of tokens per head chunk")
    if input_ids.dim() != 2 or attention_mask.shape != input_ids.shape:
        raise ValueError(
            f"input_ids {tuple(input_ids.shape)} and attention_mask {tuple(attention_mask.shape)}: pass two [B, T]"
        )
    mask = attention_mask.long()
    if position_ids is None:
        position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    out = model(
        input_ids=input_ids,
        attention_mask=mask,
        position_ids=position_ids,
        use_cache=False,
        output_hidden_states=True,
        logits_to_keep=1,
    )
    hidden = out.hidden_states[-1]  # [B, T, H]: after the final norm, i.e. what the head sees
    return head_logprobs(model, hidden, input_ids, mask, temperature=temperature, chunk_tokens=chunk_tokens,
                         with_entropy=with_entropy, target_mask=target_mask)


def head_logprobs(
    model: nn.Module,
    hidden: Tensor,
    input_ids: Tensor,
    mask: Tensor,
    *,
    temperature: float,
    chunk_tokens: int,
    with_entropy: bool,
    target_mask: Tensor | None,
) -> TokenLogprobs:
    """The output-head half of `token_logprobs`: log-probs (and entropies) from the decoder's last hidden states.

    hidden: [B, T, H] after the final norm; input_ids, mask: [B, T] long; target_mask: [B, T] bool or None.
    Position t is scored from hidden[:, t - 1], so position 0 holds 0. Returns [B, T] float32 tensors.
    """
    head = _output_head(model)
    B, T = input_ids.shape

    # Position t is predicted by the hidden state at t - 1. A token counts only when it and its predecessor are
    # real: a row's first real token has no real prefix, so it gets 0 as position 0 does, whatever the padding.
    wanted = mask[:, 1:].bool() & mask[:, :-1].bool()  # [B, T-1]
    if target_mask is not None:
        wanted = wanted & target_mask[:, 1:].bool()
    flat_index = wanted.reshape(-1).nonzero().squeeze(-1)  # [N]
    h = hidden[:, :-1].reshape(-1, hidden.shape[-1]).index_select(0, flat_index)  # [N, H]
    y = input_ids[:, 1:].reshape(-1).index_select(0, flat_index)  # [N]

    # Checkpoint only when backward will run: then each chunk's logits are recomputed there, not stored.
    recompute = torch.is_grad_enabled() and (
        h.requires_grad or any(p.requires_grad for p in head.parameters())
    )
    own_forward = head.__dict__.get("forward")  # an instance-level forward (e.g. another library's wrapper), kept
    plain_head = own_forward or type(head).forward.__get__(head)  # the head's forward, without its module hooks

    def all_chunks(h: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        """[N, H], [N] -> log-probs [N] and entropies [N] (or [0]) float32, chunk by chunk."""
        parts_logp, parts_ent = [h.new_zeros(0, dtype=torch.float32)], [h.new_zeros(0, dtype=torch.float32)]
        for start in range(0, h.shape[0], chunk_tokens):
            args = (plain_head, h[start : start + chunk_tokens], y[start : start + chunk_tokens], temperature,
                    with_entropy)
            logp, ent = checkpoint(_chunk_logprobs, *args, use_reentrant=False) if recompute else _chunk_logprobs(*args)
            parts_logp.append(logp)
            parts_ent.append(ent)
        return torch.cat(parts_logp), torch.cat(parts_ent)

    head.forward = all_chunks  # one module call for every chunk: hooks (ZeRO-3's gather and release) run once
    try:
        values_logp, values_ent = head(h, y)
    finally:
        if own_forward is None:
            del head.forward
        else:
            head.forward = own_forward

    def scatter(values: Tensor) -> Tensor:
        full = values.new_zeros(B * (T - 1)).index_put((flat_index,), values)  # skipped positions stay 0
        return torch.cat([full.new_zeros(B, 1), full.view(B, T - 1)], dim=1)  # [B, T], position 0 = 0

    return TokenLogprobs(logprobs=scatter(values_logp), entropy=scatter(values_ent) if with_entropy else None)
