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
- plain softmax sampling sorts nothing: inverse-CDF sampling, one uniform per row searched in the cumulative sum of
  the unnormalized probabilities (faster than torch.multinomial, a Gumbel or an exponential race, which all draw
  V random numbers per row);
- top-k sorts only its k candidates (`torch.topk`);
- top-p on a large CPU vocabulary finds its cut-off without sorting: a histogram of the probability mass over the
  top 16 bits of the float32 probabilities (monotone in the value) locates the bucket holding the cut-off, and only
  the few tokens in that bucket are sorted. Reading how many there are is the one device-to-host sync of this
  module. On CUDA, and for small vocabularies, a full sort is fast and deterministic, so it is used there;
- min-p needs only the row maximum.

Log-probabilities returned are those of the sampled token under the exact distribution it was drawn from: the
temperature-scaled, truncated and renormalized softmax. For greedy rows (temperature 0) there is no such
distribution; they get log_softmax of the raw (T = 1, untruncated) logits at the argmax.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

TOP_P_CANDIDATES = 1024
"""How many of the most likely tokens top-p looks at before falling back to a full sort."""


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

    def __post_init__(self) -> None:
        if not (self.temperature >= 0 and math.isfinite(self.temperature)):
            raise ValueError(f"SamplingParams: temperature must be finite and >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"SamplingParams: top_k must be >= 0 (0 = off), got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"SamplingParams: top_p must be in (0, 1], got {self.top_p}")
        if not 0 <= self.min_p < 1:
            raise ValueError(f"SamplingParams: min_p must be in [0, 1), got {self.min_p}")

    @property
    def truncates(self) -> bool:
        """Whether any of top-k, top-p, min-p removes tokens."""
        return self.top_k > 0 or self.top_p < 1 or self.min_p > 0


def _inverse_cdf(weights: Tensor, generator: torch.Generator | None) -> Tensor:
    """Draw one index per row with probability proportional to `weights`.

    weights: [B, K] float32, >= 0, every row with a positive entry. Returns [B] long. Zero-weight entries are
    never drawn: searchsorted(right=True) returns the first index whose cumulative sum exceeds the uniform.
    """
    cdf = weights.cumsum(-1)  # [B, K]
    u = torch.rand((weights.shape[0], 1), generator=generator, device=weights.device) * cdf[:, -1:]
    # u * total can round up to total itself; the clamp maps that measure-zero case to the last valid index.
    return torch.searchsorted(cdf, u, right=True).squeeze(-1).clamp_(max=weights.shape[1] - 1)


def _sample_full(scaled: Tensor, generator: torch.Generator | None) -> tuple[Tensor, Tensor]:
    """Plain softmax sampling over the whole vocabulary. scaled: [B, V] float32 -> ids [B] long, logprobs [B]."""
    top = scaled.amax(-1, keepdim=True)  # [B, 1]
    weights = (scaled - top).exp_()  # [B, V] unnormalized probabilities, max 1
    ids = _inverse_cdf(weights, generator)
    log_total = weights.sum(-1).log_()
    return ids, scaled.gather(-1, ids[:, None]).squeeze(-1) - top.squeeze(-1) - log_total


def _candidates(scaled: Tensor, params: SamplingParams) -> tuple[Tensor, Tensor, Tensor]:
    """The sorted candidate set that contains every token top-k / top-p could keep.

    scaled: [B, V] float32. Returns values [B, K] (descending), their vocabulary ids [B, K] long, and the log of
    the normalizer top-p must use [B, 1]: the candidates' own logsumexp after top-k, the full one otherwise.
    """
    vocab = scaled.shape[-1]
    if params.top_k > 0:
        values, ids = scaled.topk(min(params.top_k, vocab), dim=-1)
        return values, ids, values.logsumexp(-1, keepdim=True)
    log_norm = scaled.logsumexp(-1, keepdim=True)
    if params.top_p < 1 and vocab > TOP_P_CANDIDATES:
        values, ids = scaled.topk(TOP_P_CANDIDATES, dim=-1)
        # The nucleus is a prefix of the sorted order; it lies inside the candidates iff their mass reaches top_p.
        mass = (values - log_norm).exp().sum(-1)  # [B]
        if bool((mass >= params.top_p).all()):
            return values, ids, log_norm
    values, ids = scaled.sort(-1, descending=True)
    return values, ids, log_norm


def _sample_truncated(
    scaled: Tensor, params: SamplingParams, generator: torch.Generator | None
) -> tuple[Tensor, Tensor]:
    """Top-k / top-p / min-p sampling. scaled: [B, V] float32 -> ids [B] long, logprobs [B] float32."""
    if params.top_k == 0 and params.top_p == 1:
        # min-p alone: the row maximum is all it needs, so no sort and no candidate set.
        keep = scaled >= scaled.amax(-1, keepdim=True) + math.log(params.min_p)
        return _sample_full(scaled.masked_fill(~keep, -math.inf), generator)
    values, ids, log_norm = _candidates(scaled, params)  # [B, K] each
    keep = torch.ones_like(values, dtype=torch.bool)
    if params.top_p < 1:
        probs = (values - log_norm).exp()
        keep = probs.cumsum(-1) - probs < params.top_p  # mass strictly before each token; the top one always stays
    if params.min_p > 0:
        keep &= values >= values[:, :1] + math.log(params.min_p)
    choice, logprobs = _sample_full(values.masked_fill(~keep, -math.inf), generator)
    return ids.gather(-1, choice[:, None]).squeeze(-1), logprobs


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
    with temperature 0 are greedy. Returns ids [B] long and logprobs [B] float32 (see the module docstring).
    """
    if logits.dim() != 2:
        raise ValueError(f"sample_next_token: logits must be [B, V], got shape {tuple(logits.shape)}")
    logits = logits.float()
    if temperature is None:
        if params.temperature == 0:
            return _greedy(logits)
        scaled = logits if params.temperature == 1 else logits / params.temperature
        return _sample_truncated(scaled, params, generator) if params.truncates else _sample_full(scaled, generator)

    if temperature.shape != (logits.shape[0],):
        raise ValueError(
            f"sample_next_token: temperature must have shape [B] = ({logits.shape[0]},), got {tuple(temperature.shape)}"
        )
    temperature = temperature.to(device=logits.device, dtype=torch.float32)
    greedy_rows = temperature == 0
    # Greedy rows are sampled at T = 1 too (their draw is discarded) so that every row consumes the same randomness.
    scaled = logits / torch.where(greedy_rows, 1.0, temperature)[:, None]
    ids, logprobs = _sample_truncated(scaled, params, generator) if params.truncates else _sample_full(scaled, generator)
    greedy_ids, greedy_logprobs = _greedy(logits)
    return torch.where(greedy_rows, greedy_ids, ids), torch.where(greedy_rows, greedy_logprobs, logprobs)
