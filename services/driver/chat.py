"""The one load generator's request: send one OpenAI ``/v1/chat/completions`` request (streamed
or not), read its answer to the end, classify the outcome and time it.

Every load in the project goes through ``send_chat``: the trace driver (``driver.py``: `tao up`,
`tao bench e2e`), the fault suite's accounted agent load (``bench/faults/workload.py``), the
router latency benchmark (``bench/router/load.py``), the router fleet benchmark
(``bench/router/fleet.py``), the live budget benchmark (``bench/budget/live.py``) and the
emulated replica's load benchmark (``bench/engine/server_bench.py``); each keeps only its own
orchestration.

Outcomes (``Outcome.kind``):

- ``ok``: a 200 with a complete answer: a stream that reached ``[DONE]`` without an error event
  and with content, or a unary answer (with ``parse``: a JSON object with ``choices`` and a
  ``usage`` object);
- ``clean_error``: an OpenAI-style error body (``{"error": {"message": str, ...}}``) with a
  non-200 status, or a stream that carried an error event and still ended with ``[DONE]``;
- ``refused``: the connection was not accepted: nothing was sent;
- ``cut``: the connection broke after the request was sent, a stream ended without
  ``[DONE]``, or the answer was not JSON where JSON was read;
- ``lost``: no answer within the client's timeout, or an answer that is none of the above
  (a non-200 without an OpenAI error body, a stream without content, a unary 200 that is not a
  chat completion).

Two ways to read a stream (``parse``):

- ``parse=True`` decodes every event: TTFT is the first chunk carrying content (the first
  token), ``usage`` is kept; what the driver and the fault accounting need;
- ``parse=False`` counts ``data:`` lines without decoding them: TTFT is the first event; what a
  latency benchmark needs, so the client stays cheap next to the processes it measures. Only the
  last event before ``[DONE]`` is decoded, when it holds an ``"error"`` key: an error event is
  seen there, where vLLM and the router send it (an error event followed by more events is
  seen only with ``parse``). A unary 200 is read, not decoded, and counts ``ok``.

Times (seconds, on ``clock``, from ``t0``: default the call) are to the response headers, to the
first token, between events (``gaps_s``) and to the end of the answer.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import aiohttp

Kind = Literal["ok", "clean_error", "refused", "cut", "lost"]
KINDS: tuple[Kind, ...] = ("ok", "clean_error", "refused", "cut", "lost")
#: statuses a client retries (like the openai client): bad gateway, unavailable, gateway timeout
RETRYABLE_STATUS = frozenset({502, 503, 504})
CHAT_PATH = "/v1/chat/completions"
_NO_HEADERS: Mapping[str, str] = {}
#: a ``data: [DONE]`` line is at most this long (``data:`` and ``[DONE]`` with some spaces)
_DONE_MAX_LEN = 20


@dataclass(slots=True)
class Outcome:
    """How one request ended (see the module docstring) and its times in seconds from ``t0``."""

    kind: Kind = "lost"
    #: the HTTP status; None when no response headers came
    status: int | None = None
    #: why it is not ``ok``: the error message, or what went wrong; "" when ok
    detail: str = ""
    #: the response headers (``x-tao-replica``, ``x-tao-hold-ms``, ``Retry-After``); empty without
    headers: Mapping[str, str] = field(default_factory=lambda: _NO_HEADERS)
    #: to the response headers; None when none came
    headers_s: float | None = None
    #: to the first token (see ``parse``); None without one. A unary answer: its end
    ttft_s: float | None = None
    #: to the end of the answer (or of the failure)
    total_s: float = 0.0
    #: data events before ``[DONE]`` (error events included); 1 for a unary 200
    chunks: int = 0
    #: between consecutive data events
    gaps_s: list[float] = field(default_factory=list)
    #: the answer's ``usage`` (with ``parse``; the last one a stream carried), else None
    usage: dict[str, Any] | None = None
    #: the body of a non-200 answer, as received
    body: bytes = b""
    #: the exception that ended the request, if one did
    exception: BaseException | None = None

    @property
    def ok(self) -> bool:
        return self.kind == "ok"

    @property
    def retryable(self) -> bool:
        """What a client retries: ``refused``, ``cut``, and clean errors with a retryable status
        or in a stream (a 200 with an error event: the replica failed mid-answer)."""
        return self.kind in ("refused", "cut") or (
            self.kind == "clean_error" and (self.status in RETRYABLE_STATUS or self.status == 200))


def open_http(total_s: float, connect_s: float | None = None) -> aiohttp.ClientSession:
    """The HTTP client session every load uses: ``total_s`` per request (the client's timeout,
    ``connect_s`` for the connection), unlimited pooled keep-alive connections."""
    timeout = aiohttp.ClientTimeout(total=total_s, connect=connect_s)
    return aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0, force_close=False))


def _error_of(raw: bytes) -> str | None:
    """The message of an OpenAI-style error body, None when ``raw`` is not one."""
    try:
        err = json.loads(raw).get("error")
    except (ValueError, AttributeError):
        return None
    if isinstance(err, dict) and isinstance(err.get("message"), str):
        return str(err["message"])
    return None


def _event_error(chunk: Any) -> str | None:
    """The message of an error event (``{"error": ...}``), None for any other event."""
    if not isinstance(chunk, dict) or "error" not in chunk:
        return None
    err = chunk["error"]
    return str(err.get("message", err)) if isinstance(err, dict) else str(err)


async def send_chat(http: aiohttp.ClientSession, url: str, body: Mapping[str, Any],
                    headers: Mapping[str, str] | None = None, *, parse: bool = True, t0: float | None = None,
                    clock: Callable[[], float] = time.perf_counter) -> Outcome:
    """POST ``body`` to ``url`` (the full chat/completions URL), read the answer, classify it.

    Streams when ``body["stream"]`` is true. ``t0``: when the request counts from, on ``clock``
    (default: now; an open loop passes the scheduled arrival, a retry the first attempt)."""
    start = clock() if t0 is None else t0
    out = Outcome()
    try:
        async with http.post(url, json=body, headers=headers) as resp:
            out.headers_s = clock() - start
            out.status = resp.status
            out.headers = resp.headers
            if resp.status != 200:
                out.body = await resp.read()
                message = _error_of(out.body)
                out.kind = "lost" if message is None else "clean_error"
                out.detail = f"bad error body {out.body[:80]!r}" if message is None else message
            elif not body.get("stream"):
                await _read_unary(resp, out, start, clock, parse)
            elif parse:
                await _read_parsed(resp, out, start, clock)
            else:
                await _read_counted(resp, out, start, clock)
    except (aiohttp.ClientConnectorError, ConnectionRefusedError) as exc:
        out.kind = "refused" if out.status is None else "cut"
        out.detail, out.exception = type(exc).__name__, exc
    except TimeoutError as exc:
        out.kind, out.detail, out.exception = "lost", "client timeout", exc
    except (aiohttp.ClientError, ConnectionError, ValueError) as exc:
        out.kind, out.detail, out.exception = "cut", f"{type(exc).__name__}: {exc}", exc
    out.total_s = clock() - start
    return out


async def _read_unary(resp: aiohttp.ClientResponse, out: Outcome, start: float, clock: Callable[[], float],
                      parse: bool) -> None:
    raw = await resp.read()
    out.ttft_s = clock() - start
    out.chunks = 1
    if not parse:
        out.kind = "ok"
        return
    answer = json.loads(raw)
    usage = answer.get("usage") if isinstance(answer, dict) else None
    if isinstance(answer, dict) and answer.get("choices") and isinstance(usage, dict):
        out.kind, out.usage = "ok", usage
    else:
        out.kind, out.detail = "lost", "not a chat completion"


def _finish_stream(out: Outcome, done: bool, error: str | None, content: bool) -> None:
    if not done:
        out.kind, out.detail = "cut", "stream ended without [DONE]"
    elif error is not None:
        out.kind, out.detail = "clean_error", error
    elif content:
        out.kind = "ok"
    else:
        out.kind, out.detail = "lost", "stream without content"


async def _read_parsed(resp: aiohttp.ClientResponse, out: Outcome, start: float, clock: Callable[[], float]) -> None:
    """Decode every event: content, the first token, usage, error events."""
    error: str | None = None
    content = done = False
    last = 0.0
    gaps = out.gaps_s
    async for raw in resp.content:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            done = True
            break
        now = clock()
        if out.chunks:
            gaps.append(now - last)
        last = now
        out.chunks += 1
        chunk = json.loads(data)
        message = _event_error(chunk)
        if message is not None:
            error = message
            continue
        if not isinstance(chunk, dict):
            continue
        choices = chunk.get("choices")
        if choices:
            content = True
            if out.ttft_s is None and isinstance(choices[0], dict) and (choices[0].get("delta") or {}).get("content"):
                out.ttft_s = now - start
        usage = chunk.get("usage")
        if usage and isinstance(usage, dict):
            out.usage = usage
    _finish_stream(out, done, error, content)


async def _read_counted(resp: aiohttp.ClientResponse, out: Outcome, start: float, clock: Callable[[], float]) -> None:
    """Count ``data:`` lines without decoding them; at ``[DONE]`` decode the last event when it
    holds an ``"error"`` key: an error event is the last one before ``[DONE]`` (as vLLM and the
    router send it). The hot loop of the latency benchmark: keep it this small."""
    done = False
    chunks = 0
    first = last = 0.0
    gaps = out.gaps_s
    previous = b""
    async for line in resp.content:
        if not line.startswith(b"data:"):
            continue
        if len(line) <= _DONE_MAX_LEN and line[5:].strip() == b"[DONE]":
            done = True
            break
        now = clock()
        if chunks:
            gaps.append(now - last)
        else:
            first = now
        last = now
        chunks += 1
        previous = line
    out.chunks = chunks
    if chunks:
        out.ttft_s = first - start
    # a quote inside a JSON string is escaped: an unescaped "error" is a key (or a value)
    error = _event_error(json.loads(previous[5:])) if done and b'"error"' in previous else None
    _finish_stream(out, done, error, chunks > 0)
