"""The KV-cache generation engine: batched autoregressive sampling with a Hugging Face causal LM.

This replaces vLLM for rollouts. Prompts are left-padded into one batch and prefilled through the KV cache in
slices of `prefill_chunk_tokens` positions (a slice's activations, not the whole prompt's, are live at once: at
Qwen2.5-7B scale an 8K-token one-shot prefill holds GBs of MLP activations per row); each decode step runs
one forward on the last sampled token of every running row (`logits_to_keep=1`) and samples with
`memagent.rollout.sampling`. Padding policy: left padding, attention mask 0 on pads, position ids = cumsum(mask) - 1,
so a row's positions start at 0 on its first real token whatever its padding.

Sampled ids are always below `vocab_size` when it is given (the tokenizer's length): Qwen2.5 pads its embedding
to 152064 rows for 151665 tokens, and a sampled padding id would decode to nothing and poison the next prompt.

A row stops at its first EOS (kept in the output, with its log-prob) or at its own `max_new_tokens`. Stopped rows
leave the running batch and the cache once they are a quarter of it (`COMPACT_FRACTION`), so late steps run on the
rows still going without a whole-cache copy at every single stop; outputs come back in input order. The KV cache is
written in place (`preallocate_kv`, memagent.rollout.kv_cache), not concatenated at every step as transformers'
DynamicCache does, in a buffer that starts at the prompt width plus one block of steps and grows a block at a time
while rows go on, never past prompt width + max_new_tokens: rows that stop early do not pay for the tokens they
could have generated. The hot loop reads the device once per step (which rows go on?), and not even that when no
EOS is set and no row is at its limit. Under DeepSpeed ZeRO-3 the caller gathers the parameters; this module does
not. Works on CUDA unchanged (the generator must then be a CUDA generator).

Shared prefill (`share_prefill`, on by default; memagent.rollout.prefill). Identical prompts are prefilled once and
their KV cache copied to each of their rows (round 1 of a group rollout: the G prompts are equal), and prompts that
agree on at least `min_shared_prefix` leading tokens prefill that prefix once (later rounds: a group's prompts agree
up to the memory). The expanded cache is never wider than an unshared one (the longest prompt: the plan counts the
middle padding it adds); what drops is prefill compute and its peak activations. Sampling is untouched: every row
still draws its own tokens.

Cancellation (`cancelled`: the server's requests past their timeout). The caller may hand one threading.Event per
row; the loop reads the set ones on the host once per step, stops those rows as if they had reached their limit and
drops them from the batch and the cache at once, so the other rows go on as they would have without them.

Stop rules (`stop_rules`: the gate decisions KEEP and ANSWER, docs/gates.md). A row may carry a function of the ids it
has sampled so far, asked after each of its tokens whether the row ends there (as at an EOS: finished, last token
kept). It reads the row's ids on the host, so the step that asks makes one device read; a rule that answers False
(this row can no longer end that way) is never asked again, which bounds the host work to a row's first few tokens.

Allowed prefixes (`allowed_prefixes`: gate decisions under `gate_decoding constrained`; memagent.rollout.constraints).
A row may carry token sequences its response must open with: for the first steps (as many as the longest sequence)
its logits are masked to its trie's children, in tensor ops over the batch with no host read; rows without prefixes
draw exactly what they would without. Such a row records the policy's unconstrained log-probs, not the masked ones.

Not done, on purpose: torch.compile / CUDA graphs for decode (no GPU measurement yet), and trimming left padding
once the longest prompts finish.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor
from transformers import DynamicCache

from memagent.rollout.constraints import FREE, TokenPrefixes, build_automaton, sample_constrained
from memagent.rollout.kv_cache import GROW_BLOCK, preallocated_cache
from memagent.rollout.prefill import prefill_prompts
from memagent.rollout.sampling import SamplingParams, sample_next_token

PLAIN_SAMPLING = SamplingParams()
"""The default rule: softmax sampling at temperature 1, no truncation."""

StopRule = Callable[[list[int]], bool | None]
"""Given the ids a row sampled so far: True = the row ends with its last token (finished, as at an EOS); None =
undecided, ask again after the next token; False = it cannot end this way any more, never ask again."""

COMPACT_FRACTION = 0.25
"""Stopped rows leave the batch (and the KV cache) once they are this fraction of it. Dropping a row copies the whole
cache, so doing it at every stop (up to B copies per call) cost more than carrying a few idle rows, whose decode step
is nearly free while a step is bound by reading the weights."""


@dataclass(frozen=True)
class GenerateOutput:
    """Generated continuations, one entry per prompt, in input order."""

    tokens: list[list[int]]
    """Sampled token ids per prompt, EOS kept when produced."""
    logprobs: list[Tensor]
    """Per prompt, [len(tokens[i])] float32 on CPU: log-prob of each token under the distribution it was drawn from;
    for a token drawn under an allowed prefix, under the policy before the mask (memagent.rollout.constraints)."""
    finished: list[bool]
    """True when the row ended with EOS; False when max_new_tokens cut it (or it was 0)."""


def _check_inputs(
    prompts: list[list[int]], max_new_tokens: int | list[int], eos_token_id: int | list[int] | None
) -> tuple[list[int], list[int]]:
    """Validate the arguments; return per-row max_new_tokens and the EOS id list."""
    for i, prompt in enumerate(prompts):
        if len(prompt) == 0:
            raise ValueError(f"generate: prompts[{i}] is empty; every prompt needs at least one token")
    if isinstance(max_new_tokens, int):
        limits = [max_new_tokens] * len(prompts)
    else:
        limits = list(max_new_tokens)
        if len(limits) != len(prompts):
            raise ValueError(
                f"generate: max_new_tokens has {len(limits)} entries for {len(prompts)} prompts; give one per prompt"
            )
    if any(n < 0 for n in limits):
        raise ValueError(f"generate: max_new_tokens must be >= 0, got {max_new_tokens}")
    if eos_token_id is None:
        eos = []
    elif isinstance(eos_token_id, int):
        eos = [eos_token_id]
    else:
        eos = list(eos_token_id)
    return limits, eos


def _rule_stops(ids: Tensor, rows: Tensor, rules: dict[int, StopRule], sampled: dict[int, list[int]]) -> list[int]:
    """Input rows whose stop rule ends them at this step's token; rules that decide leave `rules`.

    ids, rows: [b] this step's token and the input index of each resident row; a stopped row has left `rules`.
    """
    ended = []
    for row, token in zip(rows.tolist(), ids.tolist()):
        rule = rules.get(row)
        if rule is None:
            continue
        sampled[row].append(token)
        verdict = rule(sampled[row])
        if verdict is not None:
            del rules[row]
            if verdict:
                ended.append(row)
    return ended


def _newly_cancelled(cancelled: Sequence[threading.Event], watched: set[int]) -> list[int]:
    """The watched rows whose event is set; they leave `watched`, so each is cut once."""
    rows = [i for i in watched if cancelled[i].is_set()]
    watched.difference_update(rows)
    return rows


def _decode_mask(model: torch.nn.Module, mask: Tensor) -> Tensor:
    """The attention mask to hand the model at decode steps, for all steps at once (sliced on its last dim).

    mask: [B, L] long, 1 = attend. With SDPA and only full-attention layers, a ready [B, 1, 1, L] bool mask (True =
    attend) is what transformers would build from the 2D one for a one-token query; passing it skips that work
    every step (about 10% of a tiny model's step). Other attention kernels and sliding-window layers need the 2D
    mask and transformers' own mask building, so they get it unchanged.
    """
    config = model.config
    layer_types = getattr(config, "layer_types", None)
    full_attention = (
        all(t == "full_attention" for t in layer_types)
        if layer_types is not None
        else getattr(config, "sliding_window", None) is None
    )
    if getattr(config, "_attn_implementation", None) == "sdpa" and full_attention:
        return mask.bool()[:, None, None, :]
    return mask


def _grow_columns(t: Tensor, more: int, fill: int) -> Tensor:
    """t with `more` columns of `fill` appended on its last dim (a copy)."""
    return torch.cat([t, t.new_full((*t.shape[:-1], more), fill)], dim=-1)


# no_grad, not inference_mode: under bf16 autocast over fp32 weights, autocast caches a weight's bf16 copy only for
# tensors that require grad outside inference mode. In inference mode every decode step cast all the weights again
# (SmolLM2, 8 rows: 179-205 ms a step against 156-160 ms in plain fp32; with the cache, 110-119 ms).
@torch.no_grad()
def _decode(
    model: torch.nn.Module,
    prompts: list[list[int]],
    limits: list[int],
    eos: list[int],
    params: SamplingParams,
    generator: torch.Generator | None,
    pad_token_id: int,
    vocab_size: int | None,
    prefill_chunk_tokens: int,
    share_prefill: bool,
    min_shared_prefix: int,
    preallocate_kv: bool,
    cancelled: Sequence[threading.Event] | None,
    stop_rules: Sequence[StopRule | None] | None,
    allowed_prefixes: Sequence[TokenPrefixes | None] | None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Run prefill (memagent.rollout.prefill) and the decode loop; every limit must be >= 1.

    Returns, on CPU: tokens [B, S] long and logprobs [B, S] float32 (S <= max(limits): the steps taken, rounded up
    to a block; only the first lengths[i] entries of row i are meaningful), lengths [B] long, and finished [B] bool
    (stopped on EOS).
    """
    device = next(model.parameters()).device
    batch, steps = len(prompts), max(limits)

    def new_cache(width: int) -> DynamicCache:
        # At most the prompt width plus every step a row may take (what a KV budget assumes); one block of steps at
        # first, more only while rows go on (memagent.rollout.kv_cache).
        if not preallocate_kv:
            return DynamicCache(config=model.config)
        reserve = width + min(steps, GROW_BLOCK)
        return preallocated_cache(model.config, width + steps, reserve=reserve, block=GROW_BLOCK)

    start = prefill_prompts(
        model, prompts, pad_token_id=pad_token_id, chunk=prefill_chunk_tokens, new_cache=new_cache,
        share_prefill=share_prefill, min_shared_prefix=min_shared_prefix,
    )
    logits, prompt_mask, positions, cache = start.logits, start.mask, start.last_positions, start.cache
    width = prompt_mask.shape[1]

    # Every decode step's attention mask is a prefix view of `mask`; outputs are written in place. All three have a
    # block of step columns at first and grow a block at a time, like the cache: a call asking for 50000 tokens
    # whose rows stop early does not pay for 50000 columns.
    columns = min(steps, GROW_BLOCK)
    full_mask = torch.ones((batch, width + columns), dtype=torch.long, device=device)
    full_mask[:, :width] = prompt_mask
    mask = _decode_mask(model, full_mask)  # [b, L] or [b, 1, 1, L]
    tokens = torch.zeros((batch, columns), dtype=torch.long, device=device)
    logprobs = torch.zeros((batch, columns), dtype=torch.float32, device=device)
    lengths = torch.tensor(limits, dtype=torch.long, device=device)
    finished = torch.zeros(batch, dtype=torch.bool, device=device)
    eos_ids = torch.tensor(eos, dtype=torch.long, device=device)
    row_limits = lengths.clone()  # [b] max_new_tokens of each resident row
    rows = torch.arange(batch, device=device)  # [b] input index of each resident row
    alive = torch.ones(batch, dtype=torch.bool, device=device)  # [b] resident rows still generating
    host_limits = set(limits)  # tells, without reading the device, at which steps some row may hit its limit
    watched = set(range(batch)) if cancelled is not None else set()  # rows whose cancel event is still unseen
    rules = {i: rule for i, rule in enumerate(stop_rules or ()) if rule is not None}  # rows whose rule is undecided
    sampled: dict[int, list[int]] = {i: [] for i in rules}  # their ids so far, on the host
    sampled_width = logits.shape[-1] if vocab_size is None else min(vocab_size, logits.shape[-1])
    grammar = build_automaton(allowed_prefixes, sampled_width, device) if allowed_prefixes else None
    # [b] the trie node of each resident row (FREE: unconstrained)
    state = grammar.start if grammar is not None else torch.full((batch,), FREE, device=device)
    running, resident = batch, batch

    for step in range(steps):
        if step == tokens.shape[1]:  # known on the host: no device read
            more = min(GROW_BLOCK, steps - step)
            tokens, logprobs = _grow_columns(tokens, more, 0), _grow_columns(logprobs, more, 0)
            mask = _grow_columns(mask, more, 1)
        if grammar is not None and step < grammar.depth:  # some row may still be inside its trie
            ids, lps, state = sample_constrained(logits[:, :vocab_size], state, grammar, params, generator)
        else:
            ids, lps = sample_next_token(logits[:, :vocab_size], params, generator)  # [b], [b]
        # Stopped rows that are still resident write past their length here; the output is cut at `lengths`.
        tokens[rows, step] = ids
        logprobs[rows, step] = lps
        at_limit = step + 1 in host_limits
        natural_end = torch.isin(ids, eos_ids) if eos else None  # [b] an EOS, or a stop rule below
        by_rule = _rule_stops(ids, rows, rules, sampled) if rules else []
        if by_rule:  # a rule's stop is a natural end, like an EOS
            rule_end = torch.isin(rows, torch.tensor(by_rule, device=device))
            natural_end = rule_end if natural_end is None else natural_end | rule_end
        if natural_end is None and not at_limit:
            done = None  # nobody can stop at this step: no device read at all
        elif natural_end is None:
            done = row_limits == step + 1
        else:
            done = natural_end | (row_limits == step + 1) if at_limit else natural_end
        cut = _newly_cancelled(cancelled, watched) if watched else []
        if cut:  # these rows end with this step's token, as at their limit
            cancel = torch.isin(rows, torch.tensor(cut, device=device))
            done = cancel if done is None else done | cancel
        if done is not None:
            done = done & alive
            stopping = int(done.sum())  # the step's one device-to-host sync
            if stopping:
                stopped = rows[done]
                lengths[stopped] = step + 1
                if natural_end is not None:
                    finished[stopped] = natural_end[done]
                for row in stopped.tolist() if rules else ():  # a rule is asked only about its row's own tokens
                    rules.pop(row, None)
                alive = alive & ~done
                running -= stopping
                if running == 0:
                    break
                if cut or resident - running >= resident * COMPACT_FRACTION:  # cancelled rows leave at once
                    keep = alive.nonzero().squeeze(-1)
                    rows, row_limits, ids, positions, mask, alive, state = (
                        t[keep] for t in (rows, row_limits, ids, positions, mask, alive, state)
                    )
                    cache.batch_select_indices(keep)
                    resident = running
        positions = positions + 1
        logits = model(
            input_ids=ids[:, None],
            attention_mask=mask[..., : width + step + 1],
            position_ids=positions,
            cache=cache,
            use_cache=True,
            logits_to_keep=1,
        ).logits[:, -1, :]
    return tokens.cpu(), logprobs.cpu(), lengths.cpu(), finished.cpu()


def generate(
    model: torch.nn.Module,
    prompts: list[list[int]],
    *,
    max_new_tokens: int | list[int],
    eos_token_id: int | list[int] | None,
    params: SamplingParams = PLAIN_SAMPLING,
    generator: torch.Generator | None = None,
    pad_token_id: int = 0,
    vocab_size: int | None = None,
    prefill_chunk_tokens: int = 0,
    share_prefill: bool = True,
    min_shared_prefix: int = 32,
    preallocate_kv: bool = True,
    cancelled: Sequence[threading.Event] | None = None,
    stop_rules: Sequence[StopRule | None] | None = None,
    allowed_prefixes: Sequence[TokenPrefixes | None] | None = None,
) -> GenerateOutput:
    """Sample continuations of token-id prompts with a Hugging Face causal LM and a DynamicCache.

    prompts: B lists of token ids, each non-empty. max_new_tokens: one limit for all rows, or one per row (>= 0).
    eos_token_id: one id, several ids (any of them stops a row), or None (rows run to their limit). params: the
    sampling rule. generator: a torch.Generator on the model's device for reproducible draws, or None for the
    global RNG. pad_token_id: the filler id of left padding (masked out, so its value does not change results).
    vocab_size: sample only ids below it (pass len(tokenizer)); None samples from every logit. prefill_chunk_tokens:
    prefill in slices of this many positions through the cache (0 = one forward); results equal one-shot prefill.
    share_prefill: prefill each distinct prompt once and copy its KV cache to the rows that repeat it (see the
    module docstring); results equal unshared prefill up to float rounding of a smaller batch. min_shared_prefix:
    with share_prefill, prompts agreeing on at least this many leading tokens prefill them once (0 = only identical
    prompts are shared; memagent.rollout.prefill). preallocate_kv:
    write the KV cache in place in a buffer grown in blocks (memagent.rollout.kv_cache) instead of transformers'
    concatenating DynamicCache; the same numbers, less copying per decode step. cancelled: one event per prompt, or
    None; a row whose event is set stops at the next decode step with the tokens it has (finished False unless the
    last is an EOS) and leaves the batch, and a row whose event is set before the call never enters it.
    stop_rules: one `StopRule` (or None) per prompt, or None; a row whose rule says True ends with that token,
    finished True (see the module docstring). allowed_prefixes: per prompt, the token sequences its response must
    open with (memagent.rollout.constraints.tokenize_prefixes), or None; None for all rows constrains nothing.
    The model runs on the device of its parameters; its train/eval mode is left as the caller set it.
    """
    if vocab_size is not None and vocab_size < 1:
        raise ValueError(f"generate: vocab_size={vocab_size} must be >= 1 (len(tokenizer)) or None")
    if prefill_chunk_tokens < 0:
        raise ValueError(f"generate: prefill_chunk_tokens={prefill_chunk_tokens} must be >= 0 (0 = one forward)")
    if not prompts:
        return GenerateOutput(tokens=[], logprobs=[], finished=[])
    limits, eos = _check_inputs(prompts, max_new_tokens, eos_token_id)
    if cancelled is not None and len(cancelled) != len(prompts):
        raise ValueError(f"generate: cancelled has {len(cancelled)} events for {len(prompts)} prompts; one per prompt")
    if stop_rules is not None and len(stop_rules) != len(prompts):
        raise ValueError(f"generate: stop_rules has {len(stop_rules)} entries for {len(prompts)} prompts; one per prompt")
    if allowed_prefixes is not None and len(allowed_prefixes) != len(prompts):
        raise ValueError(
            f"generate: allowed_prefixes has {len(allowed_prefixes)} entries for {len(prompts)} prompts; one per prompt"
        )
    tokens: list[list[int]] = [[] for _ in prompts]
    logprobs = [torch.zeros(0, dtype=torch.float32) for _ in prompts]
    finished = [False] * len(prompts)
    # Rows with nothing to generate, or already cancelled, never enter the batch.
    active = [i for i, n in enumerate(limits) if n > 0 and not (cancelled is not None and cancelled[i].is_set())]
    if active:
        out_tokens, out_logprobs, lengths, out_finished = _decode(
            model, [prompts[i] for i in active], [limits[i] for i in active], eos, params, generator, pad_token_id,
            vocab_size, prefill_chunk_tokens, share_prefill, min_shared_prefix, preallocate_kv,
            None if cancelled is None else [cancelled[i] for i in active],
            None if stop_rules is None else [stop_rules[i] for i in active],
            None if allowed_prefixes is None else [allowed_prefixes[i] for i in active],
        )
        # Own copies, so that a row's log-probs do not keep the whole [B, S] buffer alive.
        for row, (i, n) in enumerate(zip(active, lengths.tolist())):
            tokens[i] = out_tokens[row, :n].tolist()
            logprobs[i] = out_logprobs[row, :n].clone()
            finished[i] = bool(out_finished[row])
    return GenerateOutput(tokens=tokens, logprobs=logprobs, finished=finished)
