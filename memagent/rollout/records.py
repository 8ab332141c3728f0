"""Typed records passed between the rollout and the trainer.

A MemAgent trajectory is not one long sequence: it is K + 1 *independent* conversations (one memory update per
chunk, then the final answer), each a fresh single-turn chat with its own prompt. The trainer sees conversations
as rows; the trajectory is what the reward and the group advantage are computed on (paper Sec. 3, "Multi-Conv").
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

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
    """Number of document chunks read (after any training-time center truncation)."""
    document_tokens: int = 0
    """Token length of the whole document in the policy tokenizer, before any truncation."""
    reward: float = 0.0
    """Outcome reward, filled in by the verifier."""
    extras: dict[str, float] = field(default_factory=dict)
    """Per-trajectory scalar diagnostics (e.g. correctness before overlong shaping)."""
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


@dataclass(frozen=True)
class ChatRequest:
    """What an agent asks of an LLM backend: one fresh chat, rendered by the backend's chat template."""

    messages: tuple[dict[str, str], ...]
    """OpenAI-style messages, e.g. ({"role": "user", "content": "..."},); the backend adds the generation prompt."""
    max_new_tokens: int
    """Cap on generated tokens for this request (memory budget, answer budget, ...)."""


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
