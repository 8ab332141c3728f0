"""Validation of chat-completion bodies: everything a client can get wrong is refused here, before batching.

A body that passes `parse_chat_body` renders with the chat template, fits the model window and has sane sampling
settings, so it cannot fail the generate batch it joins on the client's account (docs/evaluation.md, "Online models
and memagent.serve").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import jinja2
from transformers import PreTrainedTokenizerBase

from memagent.records import ChatRequest
from memagent.rollout.sampling import SamplingParams

ROLES = ("system", "user", "assistant")
"""Message roles every chat template takes; "tool" is added when the template mentions it."""
MAX_SEED = 2**63 - 1
"""Largest seed a torch.Generator accepts."""


class ApiError(Exception):
    """An error answered as an OpenAI-style body {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 type: str = "invalid_request_error") -> None:  # noqa: A002 (the OpenAI field name)
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = status, message, param, code, type

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad(message: str, param: str | None = None, code: str = "invalid_value") -> ApiError:
    """A 400: the client sent something wrong; `param` names the field."""
    return ApiError(400, message, param=param, code=code)


@dataclass(frozen=True)
class ParsedChat:
    """A validated request, ready for the batching engine."""

    request: ChatRequest
    """Messages and max_new_tokens (already clamped to the room left in the window)."""
    params: SamplingParams
    """Temperature and top_p."""
    seed: int | None
    """Per-request generator seed, or None for the server's shared generator."""


def allowed_roles(tokenizer: PreTrainedTokenizerBase) -> tuple[str, ...]:
    """ROLES, plus "tool" when the tokenizer's chat template handles tool messages."""
    template = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else ""
    return ROLES + ("tool",) if "tool" in template else ROLES


def _content(value: Any, param: str) -> str:
    """A message's text: a string, or a list of {"type": "text", "text": ...} parts joined; valid UTF-8."""
    if isinstance(value, list):
        if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in value):
            raise bad(f"'{param}' parts must all be {{\"type\": \"text\", \"text\": string}}", param)
        value = "".join(p["text"] for p in value)
    if not isinstance(value, str):
        raise bad(f"'{param}' must be a string, got {type(value).__name__}", param, "invalid_type")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise bad(f"'{param}' is not valid Unicode text (character {e.start}: a lone surrogate "
                  f"{value[e.start]!r})", param) from e
    return value


def _messages(body: dict[str, Any], roles: tuple[str, ...]) -> tuple[dict[str, str], ...]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad("'messages' must be a non-empty list", "messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise bad(f"'messages[{i}]' must be an object with 'role' and 'content'", f"messages[{i}]")
        if m.get("role") not in roles:
            raise bad(f"'messages[{i}].role' must be one of {list(roles)}, got {m.get('role')!r}",
                      f"messages[{i}].role")
        out.append({"role": m["role"], "content": _content(m.get("content"), f"messages[{i}].content")})
    return tuple(out)


def _integer(body: dict[str, Any], key: str, default: Any, low: int, high: int) -> Any:
    value = body.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise bad(f"'{key}' must be an integer in [{low}, {high}], got {value!r}", key)
    return value


def _number(body: dict[str, Any], key: str) -> float:
    value = body.get(key, 1.0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise bad(f"'{key}' must be a finite number, got {value!r}", key, "invalid_type")
    return float(value)


def parse_chat_body(body: Any, tokenizer: PreTrainedTokenizerBase, *, window: int,
                    default_max_tokens: int) -> ParsedChat:
    """Validate an OpenAI chat-completions body; raises ApiError(400) naming the offending field.

    A field set to null takes its default, as in OpenAI's API. max_tokens (or max_completion_tokens) is clamped to
    the room the prompt leaves in the `window`; a prompt that leaves no room is refused with code
    "context_length_exceeded".
    """
    if not isinstance(body, dict):
        raise bad("the body must be a JSON object")
    # OpenAI reads null as "use the default", and client libraries send null for every field the caller left unset.
    body = {key: value for key, value in body.items() if value is not None}
    messages = _messages(body, allowed_roles(tokenizer))
    if body.get("stream"):
        raise bad("streaming is not supported", "stream", "unsupported_value")
    if _integer(body, "n", 1, 1, 1) != 1:
        raise bad("only n=1 is supported", "n")
    key = "max_tokens" if "max_tokens" in body else "max_completion_tokens"
    max_tokens = _integer(body, key, default_max_tokens, 1, 2**62)
    seed = _integer(body, "seed", None, 0, MAX_SEED)
    try:
        params = SamplingParams(temperature=_number(body, "temperature"), top_p=_number(body, "top_p"))
    except ValueError as e:
        raise bad(f"bad sampling settings: {e}", "temperature" if "temperature" in str(e) else "top_p") from e
    try:
        prompt = tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=True,
                                               return_dict=False)
    except (jinja2.TemplateError, ValueError, TypeError, KeyError) as e:  # the template refusing these messages
        raise bad(f"the chat template refused these messages: {type(e).__name__}: {e}", "messages") from e
    room = window - len(prompt)
    if room < 1:
        raise bad(f"the prompt is {len(prompt)} tokens; the model window is {window}, leaving no room to answer",
                  "messages", "context_length_exceeded")
    request = ChatRequest(messages=messages, max_new_tokens=min(max_tokens, room))
    return ParsedChat(request, params, seed)
