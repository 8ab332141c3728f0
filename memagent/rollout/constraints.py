"""Grammar-constrained openings: a row's first tokens are sampled only among token sequences that spell allowed texts.

Used for gated memory (`WorkflowConfig.gate_decoding`, docs/gates.md): an untrained small model writes an offered
decision word as its first line on about 1% of updates, and RL cannot reinforce a decision it never samples. With a
constraint, the response of a gated update opens with `KEEP`, `UPDATE\\n` or `ANSWER` (the words on offer), always.

How. Each request may carry allowed prefixes (texts), tokenized with the policy tokenizer as the assistant's first
tokens (`tokenize_prefixes`). The prefixes of all rows of a `generate` call become one automaton (`build_automaton`):
a trie per distinct prefix set, its nodes numbered across the sets. A row's state is a node, or FREE once it has
spelled a whole prefix (or never had one). At a step where some row may still be inside its trie, the sampler masks
the logits of the rows in a node to that node's children (`sample_constrained`) and moves every row along its edge,
in tensor ops over the batch; FREE rows' logits are not touched. A trie branches where the prefixes' token sequences
part, so a multi-token word is several constrained steps, and a step with a single child is forced.

Log-probs. A constrained token is drawn from the policy restricted to the grammar and renormalized at each step, so
for those tokens the sampler is not the policy: this is the departure any grammar-constrained decoding makes in RL.
What is recorded is the policy's own, unconstrained log-prob of the token at the sampling temperature (the quantity
memagent.rl recomputes as the old log-prob), not the masked one. So `rollout.reuse_logprobs` stays exact, and the
PPO ratio is pi_theta / pi_old of the policy: a positive advantage raises the chosen word's probability under the
unconstrained policy, which is how the model learns the format it was made to follow.

Exploration (`SamplingParams.prefix_explore`, set from `rollout.gate_explore` in training). A constrained step may mix
a uniform draw over the node's children into the renormalized policy (`explore_logits`), so a word the policy all
but rules out is still sampled; a second departure of the same kind, recorded the same way (the policy's log-prob).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor
from transformers import PreTrainedTokenizerBase

from memagent.rollout.sampling import SamplingParams, sample_next_token

TokenPrefixes = tuple[tuple[int, ...], ...]
"""The allowed opening token sequences of one row: one tuple of ids per allowed text."""
FREE = -1
"""The state of a row outside every trie: its logits are left as they are."""


def tokenize_prefixes(tokenizer: PreTrainedTokenizerBase, texts: Sequence[str]) -> TokenPrefixes:
    """The token ids of each text as the first tokens of a response.

    Each text is encoded on its own, without special tokens. For byte-level BPE tokenizers (SmolLM2, Qwen2.5, the
    tiny test tokenizer) that is how the text is tokenized right after the chat template's generation prompt, which
    ends in a newline that pre-tokenization splits off (tests/rollout/test_constrained_decisions.py checks the chat
    template's rendering of a reply). SmolLM2: KEEP = KE|EP, UPDATE\\n = UPDATE|\\n, ANSWER = AN|SW|ER; the tiny
    tokenizer spells every letter. Only this spelling is allowed, not every token sequence that decodes to the text.
    """
    out = []
    for text in texts:
        if not text:
            raise ValueError("tokenize_prefixes: an allowed prefix is empty; give the text the response must open with")
        out.append(tuple(tokenizer(text, add_special_tokens=False)["input_ids"]))
    return tuple(out)


@dataclass(frozen=True)
class PrefixAutomaton:
    """The tries of one `generate` call's rows, as tensors on the model's device."""

    allowed: Tensor
    """[N, V] bool: the tokens a row in node n may sample (its children); V is the sampled logits' width."""
    edge_node: Tensor
    """[E] long: the node each edge leaves."""
    edge_token: Tensor
    """[E] long: the token it reads."""
    edge_child: Tensor
    """[E] long: the node it enters, FREE where the token completes a prefix."""
    start: Tensor
    """[B] long: each row's root, FREE for a row without prefixes."""
    depth: int
    """Tokens of the longest prefix: from this step on every row is FREE, and the sampler skips the mask."""


def build_automaton(row_prefixes: Sequence[TokenPrefixes | None], width: int, device: torch.device) -> PrefixAutomaton:
    """One trie per distinct prefix set among the rows (None or () = unconstrained), nodes numbered across them.

    width: the vocabulary the sampler draws from (logits' last dim after the vocab_size cut); every id must be below.
    A prefix whose token sequence is a proper prefix of another's is refused: a row is FREE as soon as it has spelled
    a whole prefix, so the longer one could not be enforced.
    """
    edges: dict[tuple[int, int], int] = {}  # (node, token) -> child node or FREE
    roots: dict[TokenPrefixes, int] = {}
    nodes = 0
    for prefixes in row_prefixes:
        if not prefixes or prefixes in roots:
            continue
        roots[prefixes], nodes = nodes, nodes + 1
        for sequence in prefixes:
            if not sequence:
                raise ValueError("build_automaton: an allowed prefix has no tokens")
            if max(sequence) >= width or min(sequence) < 0:
                raise ValueError(f"build_automaton: prefix {sequence} has an id outside the {width} sampled tokens")
            node = roots[prefixes]
            for i, token in enumerate(sequence):
                last = i == len(sequence) - 1
                child = edges.get((node, token))
                if child is None:
                    child = FREE if last else nodes
                    if not last:
                        nodes += 1
                    edges[(node, token)] = child
                elif (child == FREE) != last:
                    raise ValueError(f"build_automaton: among the prefixes {prefixes} one is a proper token prefix of "
                                     "another; a row is free once it spells a whole prefix, so the longer cannot hold")
                node = child
    allowed = torch.zeros((nodes, width), dtype=torch.bool)
    for node, token in edges:
        allowed[node, token] = True
    pairs = list(edges.items())
    return PrefixAutomaton(
        allowed=allowed.to(device),
        edge_node=torch.tensor([n for (n, _), _ in pairs], dtype=torch.long, device=device),
        edge_token=torch.tensor([t for (_, t), _ in pairs], dtype=torch.long, device=device),
        edge_child=torch.tensor([c for _, c in pairs], dtype=torch.long, device=device),
        start=torch.tensor([roots[p] if p else FREE for p in row_prefixes], dtype=torch.long, device=device),
        depth=max((len(s) for p in roots for s in p), default=0),
    )


def mask_logits(logits: Tensor, state: Tensor, automaton: PrefixAutomaton) -> Tensor:
    """logits [b, V] with -inf outside each constrained row's allowed tokens (a copy); FREE rows keep every value.

    state: [b] long, a node or FREE per row.
    """
    allowed = automaton.allowed[state.clamp(min=0)] | (state == FREE)[:, None]  # [b, V] bool
    return logits.masked_fill(~allowed, float("-inf"))


def explore_logits(logits: Tensor, state: Tensor, automaton: PrefixAutomaton, explore: float,
                   temperature: float) -> Tensor:
    """Logits [b, V] float32 whose softmax at `temperature` is, for a constrained row, (1 - explore) x the policy
    renormalized over its node's children + explore x uniform over them; FREE rows keep their logits.

    state: [b] long. Epsilon-greedy exploration of the decisions (docs/gates.md, "Exploring the decisions"): a policy
    that puts almost no mass on a word, relative to the others, never samples it, and RL cannot raise what it never
    samples. explore 0 or greedy (temperature 0) gives mask_logits' logits: no exploration.
    """
    masked = mask_logits(logits, state, automaton).float()
    if explore == 0 or temperature == 0:
        return masked
    allowed = automaton.allowed[state.clamp(min=0)]  # [b, V] bool; FREE rows read node 0 and are discarded below
    policy = (masked / temperature).softmax(-1)
    uniform = allowed / allowed.sum(-1, keepdim=True).clamp(min=1)
    mixed = (1 - explore) * policy + explore * uniform  # zero outside the children, so its log is -inf there
    return torch.where((state != FREE)[:, None], mixed.log() * temperature, masked)


def advance(state: Tensor, ids: Tensor, automaton: PrefixAutomaton) -> Tensor:
    """Each row's state after sampling ids [b] long: the child along its edge, FREE off the trie or past a prefix."""
    # [b, E]: a row's edge, if any; FREE matches none (every edge leaves a node >= 0)
    match = (state[:, None] == automaton.edge_node) & (ids[:, None] == automaton.edge_token)
    child = automaton.edge_child[match.int().argmax(-1)]
    return torch.where(match.any(-1), child, FREE)


def policy_logprobs(logits: Tensor, ids: Tensor, temperature: float) -> Tensor:
    """log softmax(logits / T)[ids], the unconstrained policy's log-prob at the sampling temperature ([b] float32).

    logits: [b, V] any float dtype. Greedy (T = 0) uses T = 1, the sampler's convention for greedy rows.
    """
    scaled = logits.float() / (temperature or 1.0)
    return scaled.log_softmax(-1).gather(-1, ids[:, None]).squeeze(-1)


def sample_constrained(
    logits: Tensor, state: Tensor, automaton: PrefixAutomaton, params: SamplingParams,
    generator: torch.Generator | None,
) -> tuple[Tensor, Tensor, Tensor]:
    """One decode step with the rows in a trie restricted to its children.

    logits: [b, V]; state: [b] long. Returns ids [b] long, logprobs [b] float32 and the next state [b] long. Every
    row is drawn in one `sample_next_token` call, so the random numbers each row consumes do not depend on which rows
    are constrained; FREE rows get exactly the ids and log-probs they would get without any constraint. A
    constrained row draws from its masked logits, mixed with a uniform draw over the allowed tokens when
    params.prefix_explore > 0 (params' truncation then applies within the allowed tokens), but records the policy's
    unconstrained log-prob (see the module docstring).
    """
    draw_from = explore_logits(logits, state, automaton, params.prefix_explore, params.temperature)
    ids, logprobs = sample_next_token(draw_from, params, generator)
    # Departure from on-policy sampling, named: these ids come from the policy restricted to the grammar; their
    # recorded log-prob is the policy's own, which is what the old log-prob recomputation and the PPO ratio use.
    logprobs = torch.where(state != FREE, policy_logprobs(logits, ids, params.temperature), logprobs)
    return ids, logprobs, advance(state, ids, automaton)
