"""An OpenAI-compatible chat server on our own engine: request validation, batching engine, HTTP front.

`python -m memagent.serve` is the command line (memagent/serve.py).
"""

from memagent.server.engine import BatchingEngine, RequestTimeout, complete_isolated
from memagent.server.http import LOOPBACK, ChatServer, completion_body
from memagent.server.requests import ApiError, ParsedChat, allowed_roles, parse_chat_body

__all__ = [
    "LOOPBACK",
    "ApiError",
    "BatchingEngine",
    "ChatServer",
    "ParsedChat",
    "RequestTimeout",
    "allowed_roles",
    "complete_isolated",
    "completion_body",
    "parse_chat_body",
]
