"""The records every layer passes on: questions, LLM calls, trajectories, rewards and training rows.

This module sits at the bottom of the package (docs/architecture.md): data, rollout and rl import it, and it
imports nothing of ours. A MemAgent trajectory is not one long sequence: it is K + 1 *independent* conversations
(one memory update per chunk, then the final answer), each a fresh single-turn chat with its own prompt. The
trainer sees conversations as rows (`TrainRow`); the trajectory is what the reward and the group advantage are
computed on (paper Sec. 3, "Multi-Conv").
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class Sample:
    """One long-context question. The document (`context`) is kept apart from the question (`question`), as in
    MemAgent's data: the agent shows the question at every chunk and streams the context chunk by chunk."""

    context: str
    """The long document."""
    question: str
    """The question (MemAgent's `input`), shown as <problem> in every prompt."""
    answers: list[str]
    """Gold answer strings (all of them are required for RULER multi-answer tasks)."""
    task: str = ""
    """Task family, e.g. "niah_single_1", "kv_retrieval", "hotpotqa"."""
    index: int = 0
    """Position of the sample in its data set."""
    length: int = 0
    """Token length of the context under the tokenizer it was generated for (0 when unknown)."""
    extra: dict[str, object] = field(default_factory=dict)
    """Format-specific fields kept for round-trips (e.g. num_docs, data_source)."""


@dataclass(frozen=True)
class Reward:
    """One trajectory's outcome reward (paper Sec. 3: scored on the final answer only), kept in its parts."""

    correct: float
    """Verifier score of the final answer: 1/0 strict, or in [0, 1] lenient. Dynamic sampling filters on it (default)."""
    overlong: float = 0.0
    """DAPO's soft overlong penalty on the answer length (<= 0; 0 with shaping off), docs/rl-math.md §4."""
    read_cost: float = 0.0
    """Gated memory's efficiency term, -lambda x chunks read / chunks in the document (<= 0; 0 when off), docs/gates.md."""
    write_cost: float = 0.0
    """Gated memory's other efficiency term, -mu x memory tokens written / (memory budget x chunks in the document)
    (<= 0; 0 when off), docs/gates.md."""

    @property
    def total(self) -> float:
        """The scalar the group advantage is computed from."""
        return self.correct + self.overlong + self.read_cost + self.write_cost


MEMORY = "memory"
ANSWER = "answer"
TURN = "turn"


@dataclass
class Conversation:
    """One independent LLM call of a trajectory, as token ids.

    `response_mask` marks the tokens the policy sampled (EOS included) with 1 and tokens the agent forced into the
    response (tool output in a multi-turn agent) with 0. Loss masks come from this structure, never from token ids.
    """

    prompt_ids: list[int]
    """Prompt tokens (chat template applied), never trained on."""
    response_ids: list[int]
    """Response tokens: sampled tokens, EOS kept when produced, plus any forced tool tokens."""
    response_mask: list[int]
    """Per response token: 1 = sampled by the policy, 0 = forced by the agent. Same length as response_ids."""
    logprobs: torch.Tensor
    """[len(response_ids)] float32: behaviour log-probs of the sampled tokens; 0.0 where response_mask is 0."""
    finished: bool
    """True when the last sampled turn ended with EOS; False when max_new_tokens cut it."""
    kind: str
    """MEMORY (a memory update), ANSWER (the final answer) or TURN (a generic agent's turn)."""
    chunk_index: int = -1
    """Index of the chunk this memory update read; -1 for answers and generic turns."""
    text: str = ""
    """Decoded response; for a memory update this is the memory after this step."""
    decision: str = ""
    """A gated memory update's decision (docs/gates.md): KEEP, UPDATE, ANSWER or UNPARSED; "" without gates."""
    decision_tokens: int = 0
    """Leading response tokens spent on that decision (all of a KEEP or ANSWER response); the rest wrote memory."""

    def __post_init__(self) -> None:
        n = len(self.response_ids)
        if len(self.response_mask) != n or self.logprobs.shape != (n,):
            raise ValueError(
                f"Conversation: response_ids ({n}), response_mask ({len(self.response_mask)}) and logprobs "
                f"{tuple(self.logprobs.shape)} must have the same length"
            )

    @property
    def num_trained_tokens(self) -> int:
        return int(sum(self.response_mask))


@dataclass
class Trajectory:
    """All conversations of one rollout of one question, plus its outcome.

    The outcome reward belongs to the trajectory (scored on the final answer only); its group advantage is
    broadcast to every conversation (memagent.rl.broadcast_to_conversations).
    """

    sample_index: int
    """Index of the question this trajectory answers; the G rollouts of one question share it (the group id)."""
    conversations: list[Conversation]
    """Memory updates in chunk order, then the final answer (for MemAgent); any turns for other agents."""
    answer: str = ""
    """Decoded final answer text."""
    num_chunks: int = 0
    """Number of document chunks read (after any training-time center truncation): one per memory update, fewer
    than document_chunks when the exit gate stopped reading or a request failed."""
    document_chunks: int = 0
    """Number of chunks of the document as the workflow would read it whole (after any center truncation)."""
    document_tokens: int = 0
    """Token length of the whole document in the policy tokenizer, before any truncation."""
    reward: Reward | None = None
    """Outcome reward in its parts, filled in by memagent.rl.rewards.score_trajectories (None until scored)."""
    error: str | None = None
    """Set when an LLM request of this trajectory failed (an HTTP backend after its retries); the answer is then
    "" and the trajectory must be scored as a failure, never dropped from the denominator."""

    @property
    def memories(self) -> list[str]:
        """Memory text after each chunk, in order."""
        return [c.text for c in self.conversations if c.kind == MEMORY]

    @property
    def memory_truncated(self) -> list[bool]:
        """Per memory update: True when the update hit the memory budget (cut, not ended by EOS)."""
        return [not c.finished for c in self.conversations if c.kind == MEMORY]

    @property
    def answer_tokens(self) -> int:
        """Response tokens of the final answer (0 when the trajectory has none)."""
        answers = [c for c in self.conversations if c.kind == ANSWER]
        return len(answers[-1].response_ids) if answers else 0

    @property
    def decisions(self) -> list[str]:
        """Per memory update, in chunk order: its gate decision ("" without gates)."""
        return [c.decision for c in self.conversations if c.kind == MEMORY]

    @property
    def memory_tokens_generated(self) -> int:
        """Response tokens that wrote memory, over all memory updates: decision tokens excluded, so a KEEP or ANSWER
        round adds 0."""
        return sum(len(c.response_ids) - c.decision_tokens for c in self.conversations if c.kind == MEMORY)

    @property
    def generated_tokens(self) -> int:
        """Response tokens of every conversation (decisions, memories and the answer)."""
        return sum(len(c.response_ids) for c in self.conversations)

    @property
    def mean_memory_tokens(self) -> float:
        """Mean response tokens of the memory updates (0.0 when there are none)."""
        sizes = [len(c.response_ids) for c in self.conversations if c.kind == MEMORY]
        return sum(sizes) / len(sizes) if sizes else 0.0


@dataclass(frozen=True)
class ChatRequest:
    """What an agent asks of an LLM backend: one fresh chat, rendered by the backend's chat template."""

    messages: tuple[dict[str, str], ...]
    """OpenAI-style messages, e.g. ({"role": "user", "content": "..."},); the backend adds the generation prompt."""
    max_new_tokens: int
    """Cap on generated tokens for this request (memory budget, answer budget, ...)."""
    stop_texts: tuple[str, ...] = ()
    """Generation ends as soon as the response so far, stripped, equals one of these (the gate decisions KEEP and
    ANSWER, docs/gates.md). The local engine stops there; an HTTP backend ignores them (the agent reads the first line)."""
    allowed_prefixes: tuple[str, ...] = ()
    """Constrained decoding: the response opens with one of these texts (the gate decisions under gate_decoding
    constrained, docs/gates.md). The local engine samples its first tokens only among their tokenizations; an HTTP
    backend cannot and ignores them."""


@dataclass
class Completion:
    """A backend's answer to one ChatRequest.

    A local backend fills the token fields; an HTTP backend (OpenAI-compatible endpoint) has text only, leaves the
    token fields empty, and sets `error` instead of raising when a request failed after its retries.
    """

    text: str
    """Decoded response, special tokens skipped."""
    prompt_ids: list[int] = field(default_factory=list)
    """Prompt tokens as the backend rendered them (chat template applied)."""
    response_ids: list[int] = field(default_factory=list)
    """Sampled tokens, EOS kept when produced."""
    logprobs: torch.Tensor | None = None
    """[len(response_ids)] float32 log-probs of the sampled tokens under the sampling distribution."""
    finished: bool = True
    """True when generation ended with EOS (or the server's stop), False when cut by max_new_tokens."""
    error: str | None = None
    """Set when the request failed; the caller must count it as a failure, never drop it."""


@dataclass
class TrainRow:
    """One conversation ready for the loss: prompt + response ids and per-response-token inputs."""

    input_ids: list[int]
    """Prompt then response token ids."""
    prompt_len: int
    """Number of prompt tokens at the start of input_ids (never trained on)."""
    response_mask: list[int]
    """[len(input_ids) - prompt_len] 1 = sampled by the policy (trained), 0 = forced."""
    advantage: float
    """The trajectory's group advantage, broadcast to this conversation."""
    old_logprobs: torch.Tensor | None = None
    """[response length] float32 log-probs under the policy before the update (recomputed, no grad)."""
    ref_logprobs: torch.Tensor | None = None
    """[response length] float32 log-probs under the frozen reference model (KL only)."""

    @property
    def num_trained_tokens(self) -> int:
        return int(sum(self.response_mask))

    @classmethod
    def from_conversation(cls, conversation: Conversation, advantage: float = 0.0) -> TrainRow:
        """The row of one conversation: loss on its sampled response tokens, weighted by `advantage`."""
        return cls(input_ids=list(conversation.prompt_ids) + list(conversation.response_ids),
                   prompt_len=len(conversation.prompt_ids), response_mask=list(conversation.response_mask),
                   advantage=advantage)
