"""Row <-> Sample conversion for the three on-disk formats, with field checks that name the bad field.

- "eval": MemAgent's eval_{N}.json rows {context, input, answers, num_docs?, index}
  (memory_eval/convert_to_eval.py; docs/workflow.md, Data).
- "ruler": MemAgent's RULER JSONL rows {index, input, context, outputs, length, answer_prefix?}: upstream RULER
  embeds the context in `input`; MemAgent's copy keeps it apart, and so do we.
- "train": MemAgent's training rows (taskutils/memory_data/processing.py, verl's RL dataset layout)
  {data_source, prompt=[{"role": "user", "content": question}], context, ability,
  reward_model={"style": "rule", "ground_truth": [answers]}, extra_info={index, question, num_docs}}.
Our additions, ignored by MemAgent's loaders: `task` and `length` keys where the format has no field for them,
and any other `Sample.extra` entries (top-level keys, or inside extra_info for "train"). So a file we wrote reads
back as the same samples.
"""

from __future__ import annotations

from typing import Any

from memagent.records import Sample

FORMATS = ("eval", "ruler", "train")
DEFAULT_ABILITY = "memory"
"""MemAgent's `ability` value; not stored in Sample.extra when it has this value."""


class FieldError(ValueError):
    """A bad field of one row; the reader adds the file and line."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"field '{field}' {problem}")
        self.field = field
        self.problem = problem

    def nested(self, parent: str) -> FieldError:
        """The same error for a field inside `parent` (e.g. reward_model.ground_truth)."""
        return FieldError(f"{parent}.{self.field}", self.problem)


def get_str(row: dict[str, Any], field: str, *, allow_empty: bool = True) -> str:
    if field not in row:
        raise FieldError(field, "is missing")
    value = row[field]
    if not isinstance(value, str):
        raise FieldError(field, f"must be a string, got {type(value).__name__}")
    if not allow_empty and not value.strip():
        raise FieldError(field, "is empty (pass allow_empty_context=True to accept empty contexts)")
    return value


def get_str_list(row: dict[str, Any], field: str, *, allow_str: bool = False) -> list[str]:
    if field not in row:
        raise FieldError(field, "is missing")
    value = row[field]
    if allow_str and isinstance(value, str):
        return [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise FieldError(field, "must be a list of strings")
    if not value:
        raise FieldError(field, "must hold at least one gold answer")
    return list(value)


def get_int(row: dict[str, Any], field: str, default: int | None = None) -> int:
    if field not in row or row[field] is None:
        if default is None:
            raise FieldError(field, "is missing")
        return default
    value = row[field]
    if isinstance(value, bool) or not isinstance(value, int):
        raise FieldError(field, f"must be an integer, got {type(value).__name__}")
    return value


def get_dict(row: dict[str, Any], field: str) -> dict[str, Any]:
    if field not in row:
        raise FieldError(field, "is missing")
    if not isinstance(row[field], dict):
        raise FieldError(field, f"must be an object, got {type(row[field]).__name__}")
    return row[field]


def detect_row_format(row: dict[str, Any]) -> str | None:
    """The format a row's keys belong to, or None."""
    if "reward_model" in row or "prompt" in row:
        return "train"
    if "outputs" in row:
        return "ruler"
    if "answers" in row:
        return "eval"
    return None


def _context(row: dict[str, Any], allow_empty: bool) -> str:
    if isinstance(row.get("context"), list):
        raise FieldError(
            "context",
            "is a list of document indices (MemAgent's layout above 10000 documents): resolve it first",
        )
    return get_str(row, "context", allow_empty=allow_empty)


def _rest(row: dict[str, Any], known: set[str]) -> dict[str, object]:
    return {k: v for k, v in row.items() if k not in known}


def _reserved_check(sample: Sample, reserved: set[str]) -> None:
    clash = sorted(reserved & sample.extra.keys())
    if clash:
        raise ValueError(f"sample {sample.index}: extra keys {clash} clash with the format's own fields")


# ---- eval_{N}.json -------------------------------------------------------------------------------------------

_EVAL_KEYS = {"context", "input", "answers", "num_docs", "index", "task", "length"}


def eval_row(sample: Sample) -> dict[str, object]:
    _reserved_check(sample, _EVAL_KEYS - {"num_docs"})
    row: dict[str, object] = {
        "context": sample.context,
        "input": sample.question,
        "answers": list(sample.answers),
    }
    if "num_docs" in sample.extra:
        row["num_docs"] = sample.extra["num_docs"]
    row["index"] = sample.index
    if sample.task:
        row["task"] = sample.task
    if sample.length:
        row["length"] = sample.length
    row.update(_rest(sample.extra, {"num_docs"}))
    return row


def sample_from_eval(row: dict[str, Any], position: int, allow_empty: bool) -> Sample:
    extra = _rest(row, _EVAL_KEYS)
    if "num_docs" in row:
        extra = {"num_docs": get_int(row, "num_docs"), **extra}
    return Sample(
        context=_context(row, allow_empty),
        question=get_str(row, "input"),
        answers=get_str_list(row, "answers"),
        task=get_str(row, "task") if "task" in row else "",
        index=get_int(row, "index", position),
        length=get_int(row, "length", 0),
        extra=extra,
    )


# ---- RULER JSONL ---------------------------------------------------------------------------------------------

_RULER_KEYS = {"index", "input", "context", "outputs", "length", "answer_prefix", "task"}


def ruler_row(sample: Sample) -> dict[str, object]:
    _reserved_check(sample, _RULER_KEYS - {"answer_prefix"})
    row: dict[str, object] = {
        "index": sample.index,
        "input": sample.question,
        "context": sample.context,
        "outputs": list(sample.answers),
        "length": sample.length,
    }
    if "answer_prefix" in sample.extra:
        row["answer_prefix"] = sample.extra["answer_prefix"]
    if sample.task:
        row["task"] = sample.task
    row.update(_rest(sample.extra, {"answer_prefix"}))
    return row


def sample_from_ruler(row: dict[str, Any], position: int, allow_empty: bool) -> Sample:
    if "context" not in row:
        raise FieldError(
            "context", "is missing (upstream RULER embeds the context in 'input'; we need it apart)"
        )
    extra = _rest(row, _RULER_KEYS)
    if "answer_prefix" in row:
        extra = {"answer_prefix": get_str(row, "answer_prefix"), **extra}
    return Sample(
        context=_context(row, allow_empty),
        question=get_str(row, "input"),
        answers=get_str_list(row, "outputs"),
        task=get_str(row, "task") if "task" in row else "",
        index=get_int(row, "index", position),
        length=get_int(row, "length", 0),
        extra=extra,
    )


# ---- MemAgent training rows ----------------------------------------------------------------------------------

TRAIN_COLUMNS = ("data_source", "prompt", "context", "ability", "reward_model", "extra_info")
_INFO_KEYS = {"index", "question", "length"}


def train_row(sample: Sample) -> dict[str, object]:
    _reserved_check(sample, _INFO_KEYS)
    info: dict[str, object] = {"index": sample.index, "question": sample.question}
    if sample.length:
        info["length"] = sample.length
    info.update(_rest(sample.extra, {"ability"}))
    return {
        "data_source": sample.task,
        "prompt": [{"role": "user", "content": sample.question}],
        "context": sample.context,
        "ability": sample.extra.get("ability", DEFAULT_ABILITY),
        "reward_model": {"style": "rule", "ground_truth": list(sample.answers)},
        "extra_info": info,
    }


def _question_from_prompt(row: dict[str, Any]) -> str:
    prompt = row.get("prompt")
    users = (
        [m for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
        if isinstance(prompt, list)
        else []
    )
    if not users or not isinstance(users[-1].get("content"), str):
        raise FieldError("prompt", 'must be a list of messages with a {"role": "user", "content": <string>}')
    return users[-1]["content"]


def sample_from_train(row: dict[str, Any], position: int, allow_empty: bool) -> Sample:
    reward = get_dict(row, "reward_model")
    info = get_dict(row, "extra_info") if "extra_info" in row else {}
    try:
        answers = get_str_list(reward, "ground_truth", allow_str=True)
    except FieldError as err:
        raise err.nested("reward_model") from err
    try:
        index, length = get_int(info, "index", position), get_int(info, "length", 0)
    except FieldError as err:
        raise err.nested("extra_info") from err
    extra = {k: v for k, v in info.items() if k not in _INFO_KEYS and v is not None}
    ability = get_str(row, "ability") if "ability" in row else DEFAULT_ABILITY
    if ability != DEFAULT_ABILITY:
        extra["ability"] = ability
    extra.update(
        _rest(row, set(TRAIN_COLUMNS))
    )  # e.g. the responses_* / score_* columns MemAgent's filter leaves
    return Sample(
        context=_context(row, allow_empty),
        question=_question_from_prompt(row),
        answers=answers,
        task=get_str(row, "data_source") if "data_source" in row else "",
        index=index,
        length=length,
        extra=extra,
    )


TO_ROW = {"eval": eval_row, "ruler": ruler_row, "train": train_row}
FROM_ROW = {"eval": sample_from_eval, "ruler": sample_from_ruler, "train": sample_from_train}
