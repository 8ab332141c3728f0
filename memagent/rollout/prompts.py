"""MemAgent's two prompts, in our own wording, and the budgets of its workflow.

The structure follows MemAgent (paper Table 1; docs/workflow.md): a memory-update prompt made of an
instruction paragraph and the `<problem>`, `<memory>` and `<section>` blocks, ending with "Updated memory:";
and a final prompt asking for the answer in \\boxed{} from the memory alone, with `<problem>` and `<memory>`
blocks, ending with "Your answer:". Each prompt is sent as a single user message, so the tokenizer's chat
template adds its own default system prompt (Qwen2.5's, as MemAgent does) and the generation prompt. The
wording is ours; MemAgent's trailing space after `<problem>` is left out.

Question budget: a question longer than `WorkflowConfig.question_tokens` tokens keeps its *last* question_tokens
tokens (`fit_question`). Task questions put their instructions first and the query itself last ("... Question:
who ...?"), so the end is the part to keep; the prompt then stays within question + memory + chunk + template
tokens, as MemAgent sizes its prompt window (memory.py L33-34).

Gated memory (`WorkflowConfig.gates`, docs/gates.md) is a departure from MemAgent: the memory-update prompt keeps its
instruction and blocks, the decision words on offer (`GATE_CHOICES`) come between the instruction and the
`<problem>` block, and the closing line "Updated memory:" gives way to "Decision:". The words sit before anything a
question, memory or chunk changes, so every prompt of a round shares them and the engine prefills them once per
round (memagent.rollout.prefill), not once per question. With gates none every prompt is MemAgent's, byte for byte.
"""

from __future__ import annotations

from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

from memagent.rollout.gates import ANSWER_NOW, GATE_DECODING, GATES, KEEP, UPDATE, offered_words

Messages = tuple[dict[str, str], ...]

MEMORY_UPDATE_TEMPLATE = """\
You are reading a long article one section at a time in order to solve a problem. Below are the problem, \
your memory of the sections read so far, and the next section, which may or may not contain what the problem \
asks for. Read the section and rewrite the memory: add any new information that helps to solve the problem, \
and keep every relevant detail that the memory already holds.

<problem>
{problem}
</problem>

<memory>
{memory}
</memory>

<section>
{chunk}
</section>

Updated memory:
"""
"""The memory-update prompt; fields problem, memory, chunk."""

SECTION_FIRST_MEMORY_UPDATE_TEMPLATE = """\
You are reading a long article one section at a time in order to solve a problem. Below are the problem, \
the next section, which may or may not contain what the problem asks for, and your memory of the sections read \
so far. Read the section and rewrite the memory: add any new information that helps to solve the problem, \
and keep every relevant detail that the memory already holds.

<problem>
{problem}
</problem>

<section>
{chunk}
</section>

<memory>
{memory}
</memory>

Updated memory:
"""
"""The memory-update prompt with the section before the memory (`WorkflowConfig.section_first`), a departure from
MemAgent's block order: the G prompts of a group then agree up to the end of the section, not only up to the end
of the problem, so the engine prefills the chunk once per group instead of once per trajectory (docs/workflow.md,
"Section-first prompt")."""

MEMORY_UPDATE_CLOSING = "Updated memory:\n"
"""The last line of both memory-update templates; a gated prompt replaces it with `GATED_CLOSING`."""

PROBLEM_BLOCK = "<problem>\n"
"""Where both memory-update templates' blocks begin; a gated prompt puts `GATED_RULES` right before it."""

GATE_CHOICES = {
    KEEP: "KEEP: the section adds nothing that helps to solve the problem, so your memory stays exactly as it is. "
          "Write nothing after KEEP.",
    UPDATE: "UPDATE: write the updated memory on the lines after UPDATE.",
    ANSWER_NOW: "ANSWER: your memory already holds everything needed to solve the problem, so you stop reading and "
                "answer from the memory as it is (anything this section adds is not kept). Write nothing after ANSWER.",
}
"""One line per decision word of a gated prompt (docs/gates.md), shown in `offered_words` order."""

GATED_RULES = """\
Begin your reply with one decision word alone on its first line:
{choices}

"""
"""The decision words of a gated memory-update prompt, between the instruction and the blocks; field choices (the
`GATE_CHOICES` lines on offer)."""

GATED_CLOSING = "Decision:\n"
"""The last line of a gated memory-update prompt, in place of `MEMORY_UPDATE_CLOSING`."""

FINAL_ANSWER_TEMPLATE = """\
You have read a long article section by section and kept a memory of it. Using only that memory, solve the \
problem below and put the final answer in \\boxed{{}}.

<problem>
{problem}
</problem>

<memory>
{memory}
</memory>

Your answer:
"""
"""The final-answer prompt; fields problem, memory. `\\boxed{{}}` renders as `\\boxed{}` (MemAgent's async and
eval modes, not the doubled braces its sync trainer shows by accident)."""


@dataclass(frozen=True)
class WorkflowConfig:
    """The MemAgent workflow: chunk size and token budgets, at the paper's scale by default (docs/workflow.md)."""

    chunk_tokens: int = 5000
    """Document tokens per chunk (policy tokenizer, no special tokens), at fixed offsets [k*C, (k+1)*C)."""
    memory_tokens: int = 1024
    """Max new tokens of each memory update; the memory is overwritten by the whole (possibly cut) update."""
    answer_tokens: int = 1024
    """Max new tokens of the final answer."""
    max_chunks: int | None = 8
    """Training cap: center-truncate documents to max_chunks * chunk_tokens tokens; none = no cap (evaluation)."""
    question_tokens: int = 1024
    """Prompt budget for the question; a longer one keeps its last question_tokens tokens (`fit_question`)."""
    initial_memory: str = "No previous memory"
    """The memory shown with the first chunk (and in the final prompt of an empty document)."""
    section_first: bool = False
    """Departure from MemAgent: put <section> before <memory> so a group's prompts share the chunk's prefill."""
    gates: str = "none"
    """Departure from MemAgent (docs/gates.md): a decision word opens each update: none, update, exit or both."""
    gate_decoding: str = "constrained"
    """With gates: constrained samples the decision among the offered words (local engine only), free leaves it open."""

    def __post_init__(self) -> None:
        for name in ("chunk_tokens", "memory_tokens", "answer_tokens", "question_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"workflow.{name} must be >= 1, got {getattr(self, name)}")
        if self.max_chunks is not None and self.max_chunks < 1:
            raise ValueError(f"workflow.max_chunks must be >= 1 or None (no cap), got {self.max_chunks}")
        if self.gates not in GATES:
            raise ValueError(f"workflow.gates={self.gates!r}: expected one of {', '.join(GATES)}")
        if self.gate_decoding not in GATE_DECODING:
            raise ValueError(
                f"workflow.gate_decoding={self.gate_decoding!r}: expected one of {', '.join(GATE_DECODING)}"
            )

    @property
    def max_document_tokens(self) -> int | None:
        """Token cap of a document under center truncation, or None when there is no cap."""
        return None if self.max_chunks is None else self.max_chunks * self.chunk_tokens

    @property
    def gated(self) -> bool:
        """Whether memory updates start with a gate decision (docs/gates.md)."""
        return self.gates != "none"


def fit_question(question: str, tokenizer: PreTrainedTokenizerBase, max_tokens: int) -> str:
    """The question, or its last `max_tokens` tokens decoded when it is longer (see the module docstring).

    A question within the budget is returned unchanged (no decode/re-encode round trip).
    """
    if max_tokens < 1:
        raise ValueError(f"fit_question: max_tokens must be >= 1, got {max_tokens}")
    ids = tokenizer(question, add_special_tokens=False)["input_ids"]
    if len(ids) <= max_tokens:
        return question
    return tokenizer.decode(ids[-max_tokens:], skip_special_tokens=True)


def render_memory_update(
    problem: str, memory: str, chunk: str, *, section_first: bool = False, gates: str = "none"
) -> str:
    """The memory-update prompt text for one chunk; section_first picks SECTION_FIRST_MEMORY_UPDATE_TEMPLATE.

    gates other than none (docs/gates.md) put the decision words on offer before the blocks and close with
    "Decision:" instead of "Updated memory:".
    """
    template = SECTION_FIRST_MEMORY_UPDATE_TEMPLATE if section_first else MEMORY_UPDATE_TEMPLATE
    words = offered_words(gates)
    if not words:
        return template.format(problem=problem, memory=memory, chunk=chunk)
    # The template is split before formatting: a problem, memory or chunk holding "<problem>" cannot move the rules.
    instruction, _, blocks = template.partition(PROBLEM_BLOCK)
    gated = instruction + GATED_RULES + PROBLEM_BLOCK + blocks.removesuffix(MEMORY_UPDATE_CLOSING) + GATED_CLOSING
    return gated.format(problem=problem, memory=memory, chunk=chunk,
                        choices="\n".join(GATE_CHOICES[word] for word in words))


def render_final_answer(problem: str, memory: str) -> str:
    """The final-answer prompt text."""
    return FINAL_ANSWER_TEMPLATE.format(problem=problem, memory=memory)


def user_message(content: str) -> Messages:
    """A single-user-message chat: the backend's chat template adds the default system prompt."""
    return ({"role": "user", "content": content},)
