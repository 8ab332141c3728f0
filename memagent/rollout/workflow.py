"""The MemAgent workflow: read a document chunk by chunk, overwrite a fixed-budget memory, answer from it.

memory_0 = "No previous memory"; for each chunk k, memory_k = LLM(problem, memory_{k-1}, chunk_k), which
replaces the old memory; then answer = LLM(problem, memory_K) (paper Sec. 2; docs/workflow.md). Every call
is a fresh single-turn chat, recorded as its own Conversation: kind MEMORY (chunk_index k, text = the memory
after the step) for each chunk, then one ANSWER. All response tokens were sampled, so their mask is 1 (EOS
included when produced).

Memory budget. Each update is capped at `memory_tokens` new tokens; the memory is the whole decoded update
(special tokens skipped, surrounding whitespace stripped), verbatim, even when the cap cut it
(Conversation.finished False): MemAgent neither penalizes, summarizes nor retries an overflowing memory. The
budget is on generated tokens; the memory text is re-tokenized inside the next prompt, which may count a few
tokens differently (e.g. a cut multi-byte character decodes to U+FFFD).

Documents. Training center-truncates a document to max_chunks * chunk_tokens tokens; with max_chunks None
(evaluation) nothing is dropped. An empty document has no chunks: the agent answers from the initial memory at
once. A question longer than question_tokens keeps its last question_tokens tokens (prompts.fit_question).

Gated memory (`config.gates`, docs/gates.md; a departure from MemAgent). Each update response opens with a decision
word (memagent.rollout.gates): KEEP leaves the memory byte-identical, UPDATE overwrites it with the lines after the
word, ANSWER (exit gate) stops reading and asks for the answer from the memory as it is; an unparsed first line
overwrites the memory with the whole response, MemAgent's rule. The engine stops a KEEP or ANSWER response right after
the word, so the conversation's response tokens are exactly what was sampled. A gated update may generate
memory_tokens + the tokens of "UPDATE\n" (gates.update_line_tokens). With gate_decoding constrained (the default) the
request carries the decision texts as allowed prefixes, and the local engine samples the first tokens among them
(memagent.rollout.constraints). With gates none nothing here changes.

Batching. `run_memagent` runs N questions x G samples as N*G agents under the scheduler, so the k-th memory
updates of all trajectories are one generation batch; a shorter document asks for its answer earlier, in the
same batch as the others' updates. With `max_running` (evaluation), at most that many trajectories are in flight and
a finished one's slot goes to the next question at once (continuous batching by rounds, memagent.rollout.scheduler),
so early exits and short documents shorten the run instead of thinning its batches. Memory: each document is tokenized once into int32 ids shared by its G
agents, and chunks are decoded one at a time. Each Conversation keeps its prompt ids, which together hold the
document again (as Python ints); `keep_prompt_ids=False` drops them for evaluation of multi-million-token
documents, leaving per chunk only the memory and its at most memory_tokens response ids.

Resuming (`resume_from`, `on_update`; memagent.evaluation.inflight). Between chunks a rollout carries nothing but its
memory text (and with gates whether it has exited), so a rollout handed the memory updates it had made before a stop
goes on from its next chunk and makes the requests the uninterrupted one would have (tested): evaluate.py saves each
update as it is made and resumes the questions a stopped run left in flight.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence

import numpy as np
from transformers import PreTrainedTokenizerBase

from memagent.progress import Progress, progress_bar
from memagent.records import ANSWER, MEMORY, ChatRequest, Completion, Conversation, Sample, Trajectory
from memagent.rollout.agents import AgentResult, conversation_from_completion
from memagent.rollout.chunking import (
    TokenIds,
    as_token_array,
    center_truncate,
    iter_chunks,
    num_chunks,
    tokenize_document,
)
from memagent.rollout.gates import (
    ANSWER_NOW,
    decision_prefixes,
    decision_tokens,
    read_decision,
    stop_words,
    update_line_tokens,
)
from memagent.rollout.llm import LLM
from memagent.rollout.prompts import (
    WorkflowConfig,
    fit_question,
    render_final_answer,
    render_memory_update,
    user_message,
)
from memagent.rollout.scheduler import run_agents


def prepare_document(
    document: str | TokenIds, tokenizer: PreTrainedTokenizerBase, config: WorkflowConfig
) -> np.ndarray:
    """Document token ids ([T] int32), center-truncated to config.max_document_tokens when there is a cap.

    Ids already within the cap are returned without a copy, so preparing twice costs nothing.
    """
    ids = tokenize_document(document, tokenizer) if isinstance(document, str) else as_token_array(document)
    cap = config.max_document_tokens
    return ids if cap is None else center_truncate(ids, cap)


def _record(
    completion: Completion, kind: str, chunk_index: int, text: str, keep_prompt_ids: bool, *,
    decision: str = "", spent_on_decision: int = 0,
) -> Conversation:
    conversation = conversation_from_completion(completion, kind=kind, chunk_index=chunk_index, text=text)
    conversation.decision, conversation.decision_tokens = decision, spent_on_decision
    if not keep_prompt_ids:
        conversation.prompt_ids = []
    return conversation


def memagent_agent(
    question: str,
    document: str | TokenIds,
    tokenizer: PreTrainedTokenizerBase,
    config: WorkflowConfig,
    *,
    keep_prompt_ids: bool = True,
    resume_from: Sequence[Conversation] = (),
    on_update: Callable[[Conversation], None] | None = None,
) -> Generator[ChatRequest, Completion, AgentResult]:
    """One MemAgent rollout of one question, as an agent (agents.py): K MEMORY + 1 ANSWER conversations (with the
    exit gate, K may stop short of the document's chunks).

    document: the text or its token ids (ids within the config's cap are used as given, without a copy).
    resume_from: the memory updates of this rollout already run, chunks 0..j-1 (a resumed evaluation): they open the
    result, the memory starts as the last one's text and reading starts at chunk j (or the answer round runs at once
    after an ANSWER decision). Each new memory update is handed to `on_update` as it is recorded.
    """
    if any(c.kind != MEMORY or c.chunk_index != k for k, c in enumerate(resume_from)):
        raise ValueError("memagent_agent: `resume_from` must be the memory updates of chunks 0, 1, ... in order, got "
                         f"{[(c.kind, c.chunk_index) for c in resume_from]}")
    problem = fit_question(question, tokenizer, config.question_tokens)
    ids = prepare_document(document, tokenizer, config)
    memory = resume_from[-1].text if resume_from else config.initial_memory  # the memory after an update is its text
    budget = config.memory_tokens + (update_line_tokens(tokenizer) if config.gated else 0)
    stops = stop_words(config.gates)
    constrained = config.gated and config.gate_decoding == "constrained"
    opening = decision_prefixes(config.gates) if constrained else ()  # the engine samples the decision among these
    conversations: list[Conversation] = list(resume_from)
    exited = bool(resume_from) and resume_from[-1].decision == ANSWER_NOW  # the exit gate fired before the stop: answer now
    first = num_chunks(len(ids), config.chunk_tokens) if exited else len(resume_from)
    for k, chunk in enumerate(iter_chunks(ids, tokenizer, config.chunk_tokens, first=first), start=first):
        prompt = render_memory_update(problem, memory, chunk, section_first=config.section_first, gates=config.gates)
        completion = yield ChatRequest(messages=user_message(prompt), max_new_tokens=budget, stop_texts=stops,
                                       allowed_prefixes=opening)
        if completion.error is not None:
            return AgentResult(conversations=conversations, answer="", error=completion.error)
        if not config.gated:
            memory = completion.text.strip()  # overwrite: the old memory is gone (docs/workflow.md)
            update = _record(completion, MEMORY, k, memory, keep_prompt_ids)
        else:
            gated = read_decision(completion.text, memory, config.gates)  # KEEP and ANSWER hand back `memory` itself
            memory = gated.memory
            spent = decision_tokens(gated.decision, completion.response_ids, tokenizer)
            update = _record(completion, MEMORY, k, memory, keep_prompt_ids, decision=gated.decision,
                             spent_on_decision=spent)
        conversations.append(update)
        if on_update is not None:
            on_update(update)
        if config.gated and gated.stops_reading:  # the exit gate: the answer round runs now, from the memory as it is
            break

    prompt = render_final_answer(problem, memory)
    completion = yield ChatRequest(messages=user_message(prompt), max_new_tokens=config.answer_tokens)
    if completion.error is not None:
        return AgentResult(conversations=conversations, answer="", error=completion.error)
    conversations.append(_record(completion, ANSWER, -1, completion.text, keep_prompt_ids))
    return AgentResult(conversations=conversations, answer=completion.text)


def _counting_skipped_rounds(
    agent: Generator[ChatRequest, Completion, AgentResult], planned: int, bar: Progress
) -> Generator[ChatRequest, Completion, AgentResult]:
    """`agent` unchanged, except that when it returns it advances `bar` by the conversations of its `planned` it
    never ran: an exit gate's ANSWER skips the chunks after it, and the bar would otherwise end short of its total."""
    result = yield from agent
    bar.update(planned - len(result.conversations))
    return result


def run_memagent(
    samples: list[Sample],
    llm: LLM,
    config: WorkflowConfig,
    *,
    group_size: int = 1,
    keep_prompt_ids: bool = True,
    show_progress: bool = False,
    max_running: int | None = None,
    on_trajectory: Callable[[Trajectory], None] | None = None,
    resume_from: dict[int, Sequence[Conversation]] | None = None,
    on_update: Callable[[int, Conversation], None] | None = None,
) -> list[Trajectory]:
    """Roll out every question group_size times; returns N * G trajectories, each question's G contiguous.

    Trajectory i answers samples[i // group_size] (sample_index = the question's position in `samples`, the
    group id of the advantage). A trajectory whose backend call failed has `error` set (the
    backend's message) and answer "", so the verifier scores it as wrong. The documents are chunked with `llm.tokenizer`.
    show_progress: a progress bar over the conversations (K memory updates + 1 answer per trajectory) on stderr.
    max_running: at most this many trajectories in flight, the next starting as one finishes (run_agents; None:
    all at once). on_trajectory: called with each trajectory as it finishes, in finishing order.
    resume_from: per trajectory index, the memory updates it has already run (a resumed evaluation; memagent_agent);
    on_update(i, conversation): called with each new memory update of trajectory i as it is recorded.
    """
    if group_size < 1:
        raise ValueError(f"run_memagent: group_size must be >= 1, got {group_size}")
    tokenizer = llm.tokenizer
    if tokenizer is None:
        raise ValueError(
            "run_memagent: the LLM backend has no tokenizer; give it the policy's (chunks are in its tokens)"
        )
    lengths, documents = [], []
    for sample in samples:
        full = tokenize_document(sample.context, tokenizer)  # once per question, shared by its G rollouts
        lengths.append(len(full))
        documents.append(prepare_document(full, tokenizer, config))
    chunks = [num_chunks(len(ids), config.chunk_tokens) for ids in documents]
    resume_from = resume_from or {}
    resumed = sum(len(updates) for updates in resume_from.values())
    # K memory updates + 1 answer per trajectory, less those already run; an early exit advances the bar by what it
    # skipped
    bar = progress_bar(group_size * sum(k + 1 for k in chunks) - resumed, "rollout conversations",
                       enabled=show_progress)

    def agent(i: int) -> Generator[ChatRequest, Completion, AgentResult]:
        sample, ids, earlier = samples[i // group_size], documents[i // group_size], resume_from.get(i, ())
        update = None if on_update is None else lambda conversation: on_update(i, conversation)
        rollout = memagent_agent(sample.question, ids, tokenizer, config, keep_prompt_ids=keep_prompt_ids,
                                 resume_from=earlier, on_update=update)
        return _counting_skipped_rounds(rollout, chunks[i // group_size] + 1, bar)  # `earlier` counted as run

    agents = [agent(i) for i in range(group_size * len(samples))]
    done: dict[int, Trajectory] = {}

    def finished(i: int, result: AgentResult) -> None:
        done[i] = Trajectory(
            sample_index=i // group_size,
            conversations=result.conversations,
            answer=result.answer,
            num_chunks=sum(c.kind == MEMORY for c in result.conversations),
            document_chunks=chunks[i // group_size],
            document_tokens=lengths[i // group_size],
            error=result.error,
        )
        if on_trajectory is not None:
            on_trajectory(done[i])

    try:
        run_agents(agents, llm, on_round=bar.update, max_running=max_running, on_result=finished)
    finally:
        bar.close()
    return [done[i] for i in range(len(done))]
