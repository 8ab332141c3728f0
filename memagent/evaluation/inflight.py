"""The memory updates of the questions still in flight, on disk, so a stopped evaluation resumes mid-document.

traces.jsonl (memagent.evaluation.traces) holds finished samples only; a question in flight when a run stops would
start again from its first chunk, and at 64x the training length a batch of questions in flight is more than an hour
of CPU. So every memory update of a MemAgent question is appended, as it is recorded, to `inflight.jsonl` beside the
traces: one JSON line with the sample's trace key and the update (chunk index, the memory after it, its response
tokens, log-probs and gate decision). On the next run the updates of each question not yet in traces.jsonl are read
back and the question resumes at its next chunk from its last memory (memagent.rollout.workflow.memagent_agent's
`resume_from`): the memory is the whole state a MemAgent rollout carries from one chunk to the next (docs/workflow.md),
so the resumed rollout makes the same requests the uninterrupted one would have.

On open, updates of questions already finished are dropped, a question's updates are kept up to the first gap in its
chunk indices, the survivors are rewritten in one atomic replace, and a cut-off last line (a kill mid-write) is
dropped. A broken line anywhere else raises, naming the line.
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection
from pathlib import Path
from typing import Any

import torch

from memagent.evaluation.traces import TraceKey
from memagent.records import MEMORY, Conversation


def update_to_json(key: TraceKey, update: Conversation) -> dict[str, Any]:
    """One in-flight line: the question's trace key and a memory update (prompt ids are not kept)."""
    return {"key": list(key), "chunk_index": update.chunk_index, "memory": update.text,
            "response_ids": update.response_ids, "response_mask": update.response_mask,
            "logprobs": update.logprobs.tolist(), "finished": update.finished, "decision": update.decision,
            "decision_tokens": update.decision_tokens}


def update_from_json(line: dict[str, Any]) -> tuple[TraceKey, Conversation]:
    """The inverse of update_to_json."""
    source, length, index, method = line["key"]
    update = Conversation(prompt_ids=[], response_ids=list(line["response_ids"]),
                          response_mask=list(line["response_mask"]),
                          logprobs=torch.tensor(line["logprobs"], dtype=torch.float32), finished=bool(line["finished"]),
                          kind=MEMORY, chunk_index=int(line["chunk_index"]), text=str(line["memory"]),
                          decision=str(line["decision"]), decision_tokens=int(line["decision_tokens"]))
    return (str(source), int(length), int(index), str(method)), update


class InflightFile:
    """`inflight.jsonl`: the memory updates of unfinished questions; `updates[key]` are a question's, chunk 0 on.

    finished: the keys already in traces.jsonl, whose updates are dropped on open.
    """

    def __init__(self, path: str | Path, finished: Collection[TraceKey]) -> None:
        self.path = Path(path)
        self.updates: dict[TraceKey, list[Conversation]] = {}
        if self.path.exists():
            self._load(finished)

    def _load(self, finished: Collection[TraceKey]) -> None:
        data = self.path.read_bytes()
        whole = data[: data.rfind(b"\n") + 1]  # after the last newline: a line the dying run did not finish
        lines, kept = whole.split(b"\n")[:-1], []
        for number, line in enumerate(lines, start=1):
            try:
                key, update = update_from_json(json.loads(line))
            except (ValueError, KeyError, TypeError) as e:
                raise ValueError(f"{self.path}:{number}: not an in-flight memory update ({e}); fix or delete the "
                                 "file (it only saves recomputation)") from None
            updates = self.updates.setdefault(key, [])
            if key in finished or update.chunk_index != len(updates):
                continue  # finished, or after a gap: a resumed question rereads from its last contiguous chunk
            updates.append(update)
            kept.append(line + b"\n")
        self.updates = {key: updates for key, updates in self.updates.items() if updates}
        if len(kept) < len(lines) or len(whole) < len(data):
            staged = self.path.with_suffix(".jsonl.tmp")
            staged.write_bytes(b"".join(kept))
            os.replace(staged, self.path)

    def append(self, key: TraceKey, update: Conversation) -> None:
        """Write one memory update of question `key` as a line and force it to disk."""
        line = json.dumps(update_to_json(key, update), ensure_ascii=False) + "\n"
        with self.path.open("a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
        self.updates.setdefault(key, []).append(update)
