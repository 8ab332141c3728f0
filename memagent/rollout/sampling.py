"""Batched next-token sampling: temperature, top-k, top-p (nucleus), min-p, greedy.

One call draws one token per row of a [B, V] logits matrix, with no Python loop over rows. Truncations are applied
in the order temperature -> top-k -> top-p -> min-p (the order of Hugging Face's logits warpers): top-p is taken on
the distribution renormalized after top-k, and min-p keeps tokens whose probability is at least `min_p` times the
most likely token's (a ratio that renormalization does not change).

Top-p keeps the smallest prefix of the descending order whose mass reaches top_p (token j stays iff the mass of
the tokens ranked before it is < top_p, as in Hugging Face); tokens tied with the last kept one are kept too, which
makes the set independent of how a sort breaks ties.

Speed. Rollouts dominate RL training time, and a full-vocabulary sort costs more than a small model's whole decode
step at V = 32000 on CPU (measured in bench/generate.md). So:
- plain softmax sampling sorts nothing: inverse-CDF sampling with one uniform per row (faster than
  torch.multinomial, a Gumbel or an exponential race, which all draw V random numbers per row), in two levels on
  a wide vocabulary (a block of tokens, then a token in it) so that no [B, V] cumulative sum is written. On a CPU
  every pass over a [B, V] tensor counts: softmax is used as one fused op, truncation happens in place;
- top-k sorts only its k candidates (`torch.topk`);
- top-p on CPU finds its cut-off without sorting the vocabulary: a histogram of the probability mass over the top
  bits of the float32 probabilities (whose bit patterns order like their values) locates the bucket holding the
  cut-off, and only the few tokens in that bucket are sorted. Reading how many there are is the one device-to-host
  sync of this module. On CUDA, and below 256 tokens, a full sort is fast (and deterministic), so it is used there;
- min-p needs only the row maximum.

Log-probabilities returned are those of the sampled token under the exact distribution it was drawn from: the
temperature-scaled, truncated and renormalized softmax. For greedy rows (temperature 0) there is no such
distribution; they get log_softmax of the raw (T = 1, untruncated) logits at the argmax.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

HISTOGRAM_MIN_VOCAB = 256
"""Below this vocabulary size (and on CUDA) top-p finds its cut-off with a full sort instead of the histogram."""
_FLOAT_ONE_BITS = 0x3F800000
"""The int32 bit pattern of float32 1.0, the upper bound of a probability."""
_BELOW_ONE = 1.0 - 2.0**-24
"""The largest float32 below 1.0: `x > _BELOW_ONE` is `x >= 1` in float32."""
_MIN_CUTOFF = 2.0**-100
"""Floor of a truncation cut-off, so that dividing probabilities by it cannot overflow float32. What it may drop
weighs under V * 2**-100 in all, far below what a float32 total can register."""
DRAW_BLOCK = 256
"""Inverse-CDF sampling over more than 4 blocks of this many tokens goes in two levels (block, then token)."""


def _key_shift(vocab: int) -> int:
    """Histogram buckets are float32 bit patterns shifted right by this: 16 or 18 if that gives at most 2V bins
    per row, else 20.

    16 keeps sign, exponent and 7 mantissa bits (16257 bins up to 1.0), 18 and 20 two and four bits fewer. Fewer
    bins make the histogram cheaper and the crossing bucket fuller; this rule was fastest at V = 32000, 4096, 512.
    """
    return next((shift for shift in (16, 18) if (_FLOAT_ONE_BITS >> shift) <= 2 * vocab), 20)


@dataclass(frozen=True)
class SamplingParams:
    """How to turn next-token logits into a token. The defaults are plain softmax sampling."""

    temperature: float = 1.0
    """Logits are divided by this; 0 means greedy (argmax)."""
    top_k: int = 0
    """Keep only the k most likely tokens; 0 keeps all."""
    top_p: float = 1.0
    """Keep the smallest set of most likely tokens whose mass reaches top_p; 1.0 keeps all."""
    min_p: float = 0.0
    """Drop tokens less likely than min_p times the most likely token; 0.0 keeps all."""
    prefix_explore: float = 0.0
    """Rows inside an allowed-prefix trie (memagent.rollout.constraints) draw this share uniformly among the allowed
    tokens, the rest from the policy within the trie; 0.0 = off, greedy rows ignore it."""

    def __post_init__(self) -> None:
        if not (self.temperature >= 0 and math.isfinite(self.temperature)):
            raise ValueError(f"SamplingParams: temperature must be finite and >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"SamplingParams: top_k must be >= 0 (0 = off), got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"SamplingParams: top_p must be in (0, 1], got {self.top_p}")
        if not 0 <= self.min_p < 1:
            raise ValueError(f"SamplingParams: min_p must be in [0, 1), got {self.min_p}")
        if not 0 <= self.prefix_explore <= 1:
            raise ValueError(f"SamplingParams: prefix_explore must be in [0, 1], got {self.prefix_explore}")


def _draw_flat(weights: Tensor, generator: torch.Generator | None) -> Tensor:
    """Inverse-CDF draw. weights: [B, K] float32 >= 0, each row with a positive entry. Returns columns [B, 1] long.

    r is uniform on (0, total]; the first column whose cumulative weight reaches r sits above its predecessor's,
    so it has a positive weight: truncated (zero) weights are never drawn, even where rounding makes r = total.
    """
    cdf = weights.cumsum(-1)  # [B, K]
    r = (1.0 - torch.rand((weights.shape[0], 1), generator=generator, device=weights.device)) * cdf[:, -1:]
    return torch.searchsorted(cdf, r)


def _draw(weights: Tensor, generator: torch.Generator | None) -> tuple[Tensor, Tensor]:
    """Draw one column per row with probability proportional to `weights`.

    weights: [B, K] float32 >= 0, each row with a positive entry (0 = truncated). Returns column [B] long and its
    log-probability [B] float32 under the renormalized weights. Wide rows go in two levels: a block of DRAW_BLOCK
    columns in proportion to its mass, then a column inside it. That reads the [B, K] weights once (block sums)
    instead of writing a [B, K] cumulative sum, about twice as fast at K = 32000; the two steps multiply to the
    same probabilities.
    """
    batch, width = weights.shape
    if width <= 4 * DRAW_BLOCK:
        column = _draw_flat(weights, generator)  # [B, 1]
        total = weights.sum(-1, keepdim=True)
    else:
        full = width // DRAW_BLOCK
        sums = weights[:, : full * DRAW_BLOCK].view(batch, full, DRAW_BLOCK).sum(-1)  # [B, blocks]
        if full * DRAW_BLOCK < width:
            sums = torch.cat([sums, weights[:, full * DRAW_BLOCK :].sum(-1, keepdim=True)], -1)
        total = sums.sum(-1, keepdim=True)
        block = _draw_flat(sums, generator)  # [B, 1], a block with positive mass
        columns = block * DRAW_BLOCK + torch.arange(DRAW_BLOCK, device=weights.device)  # [B, DRAW_BLOCK]
        inside = columns < width  # the last block may be short; its missing columns get weight 0
        columns.clamp_(max=width - 1)
        column = columns.gather(-1, _draw_flat(weights.gather(-1, columns) * inside, generator))
    return column.squeeze(-1), (weights.gather(-1, column).log() - total.log()).squeeze(-1)


def _kept_count(cum: Tensor, target: Tensor) -> Tensor:
    """How many leading tokens top-p keeps, from inclusive cumulative masses in descending token order.

    cum: [B, K] float32, non-decreasing; target: [B, 1]. Token j stays iff the mass before it, cum[j - 1] (0 for
    j = 0), is below the target, so the count is 1 + #{j : cum[j] < target}, at most K. searchsorted finds that
    count in log K steps (cum is monotone in floating point too: it adds non-negative numbers).
    """
    return (torch.searchsorted(cum, target) + 1).clamp_(max=cum.shape[-1])


def _sorted_cutoff(sorted_weights: Tensor, top_p: float) -> Tensor:
    """Top-p cut-off of rows already sorted in descending order.

    sorted_weights: [B, K] float32 >= 0, descending. Returns [B, 1]: the smallest weight top-p keeps.
    """
    cum = sorted_weights.cumsum(-1)
    return sorted_weights.gather(-1, _kept_count(cum, top_p * cum[:, -1:]) - 1)


def _histogram_cutoff(weights: Tensor, top_p: float) -> Tensor:
    """Top-p cut-off without sorting the vocabulary (same result as `_sorted_cutoff` on the sorted rows).

    weights: [B, V] float32 in [0, 1] (probabilities, or probabilities over their row maximum). Returns [B, 1]: the
    smallest weight top-p keeps. For non-negative floats the int32 bit pattern orders like the value, so its top bits
    bucket the tokens in value order; the bucket where the cumulative mass crosses top_p holds the cut-off.
    """
    batch, vocab = weights.shape
    shift = _key_shift(vocab)
    top_key = _FLOAT_ONE_BITS >> shift
    bins = top_key + 1
    # Row b owns bins [b * bins, (b + 1) * bins), in descending key order so a forward cumsum is "mass at or above".
    # The bin index is computed in place over the key: on CPU every fresh [B, V] buffer costs page faults.
    offsets = torch.arange(batch, dtype=torch.int32, device=weights.device)[:, None] * bins + top_key  # [B, 1]
    index = weights.view(torch.int32) >> shift  # [B, V] key in [0, top_key]
    index = torch.sub(offsets, index, out=index)  # [B, V] bin index
    hist = torch.bincount(index.view(-1), weights=weights.view(-1), minlength=batch * bins)
    cum = hist.view(batch, bins).cumsum(-1)  # [B, bins]
    target = top_p * cum[:, -1:]  # [B, 1]
    crossing = torch.searchsorted(cum, target).clamp_(max=bins - 1)  # [B, 1] first bin reaching the target
    mass_above = torch.where(crossing > 0, cum.gather(-1, (crossing - 1).clamp(min=0)), 0.0)  # [B, 1]

    # Gather the tokens of each row's crossing bucket into a zero-padded [B, W] block and finish with a small sort.
    crossing_bin = (offsets - top_key + crossing).to(torch.int32)  # [B, 1]
    band = (index == crossing_bin).view(-1).nonzero().squeeze(-1)  # flat indices
    rows = band // vocab
    counts = torch.bincount(rows, minlength=batch)  # [B], >= 1 each
    slot = torch.arange(band.numel(), device=weights.device) - (counts.cumsum(0) - counts)[rows]
    block = weights.new_zeros(batch, int(counts.max()))  # the sync: the block width
    block[rows, slot] = weights.view(-1)[band]
    block = block.sort(-1, descending=True).values
    # At least 1 (the bucket is reached only when the mass above is short of the target), at most the bucket's
    # size (rounding must not let the zero padding in).
    kept = torch.minimum(_kept_count(mass_above + block.cumsum(-1), target), counts[:, None])
    return block.gather(-1, kept - 1)


def _truncate(probs: Tensor, params: SamplingParams, *, is_sorted: bool) -> Tensor:
    """Zero the probabilities that top-p and min-p remove; rescale the rest per row (draws need only proportions).

    probs: [B, K] float32 softmax output (descending along K when is_sorted); overwritten. Returns [B, K].
    """
    cutoff = None
    if params.top_p < 1:
        if is_sorted:
            cutoff = _sorted_cutoff(probs, params.top_p)
        elif probs.is_cuda or probs.shape[-1] < HISTOGRAM_MIN_VOCAB:
            cutoff = _sorted_cutoff(probs.sort(-1, descending=True).values, params.top_p)
        else:
            cutoff = _histogram_cutoff(probs, params.top_p)
    if params.min_p > 0:
        floor = params.min_p * (probs[:, :1] if is_sorted else probs.amax(-1, keepdim=True))
        # Both rules keep a prefix of the descending order, so together they keep probs >= the larger threshold.
        cutoff = floor if cutoff is None else torch.maximum(cutoff, floor)
    if cutoff is None:
        return probs
    # Dividing by the cut-off maps it to exactly 1.0 and nothing below it to 1.0 (IEEE division is correctly
    # rounded), so one scalar threshold applies every row's own cut-off; several times cheaper on CPU than
    # masked_fill or where with a per-row [B, 1] threshold.
    return F.threshold(probs.div_(cutoff.clamp_(min=_MIN_CUTOFF)), _BELOW_ONE, 0.0, inplace=True)


def _sample_scaled(scaled: Tensor, params: SamplingParams, generator: torch.Generator | None) -> tuple[Tensor, Tensor]:
    """Sample from temperature-scaled logits with params' truncation. scaled: [B, V] float32 -> ids, logprobs [B]."""
    if params.top_k > 0:
        values, ids = scaled.topk(min(params.top_k, scaled.shape[-1]), dim=-1)  # [B, k] each, descending
        column, logprobs = _draw(_truncate(values.softmax(-1), params, is_sorted=True), generator)
        return ids.gather(-1, column[:, None]).squeeze(-1), logprobs
    # softmax is one fused pass; max, subtract and exp as separate ops would each read and write [B, V].
    return _draw(_truncate(scaled.softmax(-1), params, is_sorted=False), generator)


def _greedy(logits: Tensor) -> tuple[Tensor, Tensor]:
    """Argmax and its log_softmax at T = 1. logits: [B, V] float32 -> ids [B] long, logprobs [B] float32."""
    top, ids = logits.max(-1)
    return ids, top - logits.logsumexp(-1)


def sample_next_token(
    logits: Tensor,
    params: SamplingParams,
    generator: torch.Generator | None = None,
    *,
    temperature: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Draw one token per row.

    logits: [B, V] any float dtype (computed in float32). generator: a torch.Generator on logits' device, or None
    for the global RNG. temperature: optional [B] float tensor that overrides params.temperature per row; rows
    with temperature 0 are greedy (values must be >= 0: checking would cost a device sync). Returns ids [B] long
    and logprobs [B] float32 (see the module docstring).
    """
    if logits.dim() != 2:
        raise ValueError(f"sample_next_token: logits must be [B, V], got shape {tuple(logits.shape)}")
    logits = logits.float()
    if temperature is None:
        if params.temperature == 0:
            return _greedy(logits)
        return _sample_scaled(logits if params.temperature == 1 else logits / params.temperature, params, generator)

    if temperature.shape != (logits.shape[0],):
        raise ValueError(
            f"sample_next_token: temperature must have shape [B] = ({logits.shape[0]},), got {tuple(temperature.shape)}"
        )
    temperature = temperature.to(device=logits.device, dtype=torch.float32)
    greedy_rows = temperature == 0
    # Greedy rows are sampled at T = 1 too (their draw is discarded) so that every row consumes the same randomness.
    scaled = logits / torch.where(greedy_rows, 1.0, temperature)[:, None]
    ids, logprobs = _sample_scaled(scaled, params, generator)
    greedy_ids, greedy_logprobs = _greedy(logits)
    return torch.where(greedy_rows, greedy_ids, ids), torch.where(greedy_rows, greedy_logprobs, logprobs)
