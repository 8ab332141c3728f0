"""Gated memory (docs/gates.md): a one-word decision before each memory update, then keep, rewrite, or stop reading.

A departure from MemAgent (arXiv 2507.02259), which rewrites the whole memory after every chunk and always reads the
whole document. The update gate follows GRU-Mem's (arXiv 2602.10560: keep the old memory on a chunk without
evidence); the exit gate follows GRU-Mem's exit gate and InfMem's early stop (arXiv 2602.02704: stop reading once
the memory suffices). Both gates are words the policy writes, in the same response as the memory, so they are
trained like every other response token: Multi-Conv DAPO broadcasts the trajectory's advantage to them.

Grammar. The decision is the response's first line, leading whitespace skipped and the line stripped:
  KEEP     (update gate) the memory stays byte-identical; generation stops right after the word
  UPDATE   the following lines, stripped, are the new memory (MemAgent's overwrite)
  ANSWER   (exit gate) the memory stays; reading stops and the answer round runs next; generation stops after the word
Any other first line, or a word the setting does not offer (KEEP under `exit`, ANSWER under `update`), is
UNPARSED: it acts as UPDATE with the whole response as the memory, exactly MemAgent's rule, so a model that ignores
the instruction still runs MemAgent's workflow; it is counted apart in the metrics.

Decoding (`WorkflowConfig.gate_decoding`). constrained (the default): the request carries `decision_prefixes` and
the local engine samples the response's first tokens only among their spellings (memagent.rollout.constraints), so
every decision parses; UPDATE comes with its newline token, so the memory starts on the next line. free: nothing is
constrained, and a model that ignores the instruction is UNPARSED.

Budget. A gated update may generate memory_tokens + `update_line_tokens` tokens: the tokens of "UPDATE\\n" in the
policy tokenizer on top of the memory budget, so that a memory written after the canonical decision line gets
exactly memory_tokens. `decision_tokens` splits a response into its decision tokens and its memory tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

GATES = ("none", "update", "exit", "both")
"""WorkflowConfig.gates: none (MemAgent's workflow), update (KEEP or UPDATE), exit (UPDATE or ANSWER), both."""
KEEP, UPDATE, ANSWER_NOW, UNPARSED = "KEEP", "UPDATE", "ANSWER", "UNPARSED"
"""The decisions a gated memory update records (Conversation.decision); ANSWER_NOW is the exit gate's word."""
DECISIONS = (KEEP, UPDATE, ANSWER_NOW, UNPARSED)
GATE_DECODING = ("constrained", "free")
"""WorkflowConfig.gate_decoding: constrained (the decision's tokens are sampled within the grammar) or free."""


def offered_words(gates: str) -> tuple[str, ...]:
    """The decision words the gated prompt offers, in prompt order: KEEP with the update gate, UPDATE always, ANSWER
    with the exit gate; () for gates none."""
    if gates not in GATES:
        raise ValueError(f"gates={gates!r}: expected one of {GATES}")
    if gates == "none":
        return ()
    return (*((KEEP,) if gates in ("update", "both") else ()), UPDATE,
            *((ANSWER_NOW,) if gates in ("exit", "both") else ()))


def stop_words(gates: str) -> tuple[str, ...]:
    """The offered words after which nothing more is generated (ChatRequest.stop_texts): KEEP and ANSWER."""
    return tuple(word for word in offered_words(gates) if word != UPDATE)


def decision_prefixes(gates: str) -> tuple[str, ...]:
    """The texts a constrained gated response opens with (ChatRequest.allowed_prefixes): the offered words, UPDATE
    with its newline.

    The token after UPDATE is forced to the tokenizer's spelling of "UPDATE\\n" (one "\\n" token in SmolLM2 and
    the tiny tokenizer), not left to any whitespace token holding a newline ("\\n\\n", "\\n  "), which would parse
    the same: the decision line is then the canonical one `update_line_tokens` budgets, so the memory gets exactly
    memory_tokens. The policy's mass on those other newlines goes to "\\n" (part of the constraint's departure)."""
    return tuple(f"{word}\n" if word == UPDATE else word for word in offered_words(gates))


@dataclass(frozen=True)
class GatedUpdate:
    """What one gated memory-update response decides."""

    decision: str
    """KEEP, UPDATE, ANSWER (ANSWER_NOW) or UNPARSED."""
    memory: str
    """The memory after this step: the old one, byte for byte, after KEEP and ANSWER; the new one otherwise."""
    stops_reading: bool
    """True after ANSWER: the agent reads no further chunk and asks for the answer."""


def read_decision(response: str, memory: str, gates: str) -> GatedUpdate:
    """Apply the grammar of the module docstring to one response; `memory` is the memory before this step."""
    first_line, _, rest = response.lstrip().partition("\n")
    word = first_line.strip()
    if word not in offered_words(gates):
        return GatedUpdate(UNPARSED, response.strip(), stops_reading=False)  # MemAgent's overwrite rule
    if word == UPDATE:
        return GatedUpdate(UPDATE, rest.strip(), stops_reading=False)
    return GatedUpdate(word, memory, stops_reading=word == ANSWER_NOW)


def decision_tokens(decision: str, response_ids: Sequence[int], tokenizer: PreTrainedTokenizerBase) -> int:
    """How many leading response tokens the decision took; the rest wrote the memory.

    All of a KEEP or ANSWER response (no memory is written); for UPDATE, the tokens up to and including the one that
    ends the decision line (the whole response when no newline follows the word); 0 for UNPARSED, whose every token
    wrote memory. A text-only response (an HTTP backend: no ids) gives 0.
    """
    if decision in (KEEP, ANSWER_NOW):
        return len(response_ids)
    if decision == UNPARSED:
        return 0
    for n in range(1, len(response_ids) + 1):  # the decision line is a few tokens: this stops early
        if "\n" in tokenizer.decode(response_ids[:n], skip_special_tokens=True).lstrip():
            return n
    return len(response_ids)


def update_line_tokens(tokenizer: PreTrainedTokenizerBase) -> int:
    """Tokens of the canonical decision line "UPDATE\\n" in the policy tokenizer: the allowance a gated update gets on
    top of workflow.memory_tokens."""
    return len(tokenizer(f"{UPDATE}\n", add_special_tokens=False)["input_ids"])
