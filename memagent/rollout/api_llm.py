"""An LLM backend that talks to any OpenAI-compatible chat endpoint over plain HTTP (standard library only).

It implements the `LLM` protocol (`complete(requests) -> completions`, input order) so the MemAgent workflow, the
full-context baseline and `memagent.ask` can drive an online model, a vLLM server or our own `memagent.serve`.
Each request is one POST to `{api_base}/chat/completions`; a thread pool keeps `concurrency` of them in flight.

Failures never raise and never vanish: connection errors, timeouts, 429 and 5xx are retried with exponential
backoff (`backoff * 2**attempt` seconds, `retries` times after the first attempt); anything still failing, and any
other HTTP error or malformed reply, comes back as `Completion(text="", error=...)`, which callers score as 0 and
keep in the denominator (MemAgent's own client skipped such samples, which inflates accuracy).

Left out: streaming, tool calls, token ids and log-probs (an HTTP backend has text only, so it can evaluate but
not train). A request's `stop_texts` and `allowed_prefixes` are not sent: this client neither stops on a word nor
constrains the first tokens, so a gated model behind it decides unconstrained and the agent reads only the first
line (docs/gates.md).
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from transformers import PreTrainedTokenizerBase

from memagent.records import ChatRequest, Completion

# 429 = rate limited, 5xx = the server's fault: both are worth another try. Other 4xx are our fault: retrying
# the same body would fail the same way.
_RETRY_STATUS = frozenset({429, 500, 502, 503, 504})


class OpenAIChatLLM:
    """Chat-completions client for an OpenAI-compatible server.

    api_base: URL up to and including the version, e.g. "http://127.0.0.1:8000/v1".
    api_key: sent as a Bearer token; "" sends no Authorization header (local servers).
    model: the server's model name (the "model" field of each request).
    temperature, top_p: sampling settings sent with every request (temperature 0 = greedy on most servers).
    tokenizer: the served model's tokenizer, loaded locally: MemAgent chunks documents and budgets prompts in the
        policy's tokens (the `LLM` protocol's `tokenizer`); None is enough for plain chats.
    seed: sent as the request's "seed" when given (servers that honour it become reproducible).
    concurrency: requests in flight at once.
    retries: extra attempts after the first for retryable failures.
    timeout: seconds per HTTP attempt.
    backoff: first retry delay in seconds; it doubles on each retry.
    """

    def __init__(
        self,
        api_base: str,
        api_key: str,
        model: str,
        *,
        temperature: float,
        top_p: float,
        tokenizer: PreTrainedTokenizerBase | None = None,
        seed: int | None = None,
        concurrency: int = 8,
        retries: int = 3,
        timeout: float = 600.0,
        backoff: float = 1.0,
    ) -> None:
        if not api_base.startswith(("http://", "https://")):
            raise ValueError(f"api_base must start with http:// or https://, got {api_base!r}")
        if concurrency < 1 or retries < 0 or timeout <= 0 or backoff < 0:
            raise ValueError(
                f"need concurrency >= 1, retries >= 0, timeout > 0, backoff >= 0; got concurrency={concurrency}, "
                f"retries={retries}, timeout={timeout}, backoff={backoff}"
            )
        self.url = api_base.rstrip("/") + "/chat/completions"
        self.api_key = api_key
        self.model = model
        self.tokenizer = tokenizer
        self.temperature = temperature
        self.top_p = top_p
        self.seed = seed
        self.concurrency = concurrency
        self.retries = retries
        self.timeout = timeout
        self.backoff = backoff

    def complete(self, requests: list[ChatRequest]) -> list[Completion]:
        """One Completion per request, in input order; failed requests carry `error` and empty text."""
        if not requests:
            return []
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(requests))) as pool:
            return list(pool.map(self._complete_one, requests))

    def _complete_one(self, request: ChatRequest) -> Completion:
        body = {
            "model": self.model,
            "messages": list(request.messages),
            "max_tokens": request.max_new_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
        }
        if self.seed is not None:
            body["seed"] = self.seed
        data = json.dumps(body).encode("utf-8")
        error = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff * 2 ** (attempt - 1))
            try:
                reply = self._post(data)
            except urllib.error.HTTPError as e:
                error = f"HTTP {e.code}: {_read_error_body(e)}"
                if e.code not in _RETRY_STATUS:
                    break
            # URLError: refused / DNS; TimeoutError: no reply in time; ConnectionError: reset or closed mid-reply;
            # HTTPException: a reply cut short (IncompleteRead) or not HTTP at all. All are worth a retry.
            except (urllib.error.URLError, TimeoutError, ConnectionError, http.client.HTTPException) as e:
                error = f"connection failed: {getattr(e, 'reason', None) or repr(e)}"
            else:
                return _parse_reply(reply)
        return Completion(text="", finished=False, error=f"{error} (after {attempt + 1} attempt(s) to {self.url})")

    def _post(self, data: bytes) -> bytes:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        req = urllib.request.Request(self.url, data=data, headers=headers, method="POST")
        with urllib.request.urlopen(req, timeout=self.timeout) as response:
            return response.read()


def _parse_reply(reply: bytes) -> Completion:
    """Completion from a chat.completion JSON body; a body without a usable first choice is an error."""
    try:
        choice = json.loads(reply)["choices"][0]
        text = choice["message"]["content"] or ""
    except (ValueError, KeyError, IndexError, TypeError) as e:
        return Completion(text="", finished=False, error=f"malformed reply ({e!r}): {reply[:200]!r}")
    if not isinstance(text, str):
        return Completion(text="", finished=False, error=f"malformed reply: content is {type(text).__name__}")
    # "length" means max_tokens cut the answer; "stop" (EOS or a stop string) and anything else count as ended.
    return Completion(text=text, finished=choice.get("finish_reason") != "length")


def _read_error_body(error: urllib.error.HTTPError) -> str:
    try:
        return error.read()[:300].decode("utf-8", "replace")
    except OSError:
        return error.reason or ""
