"""Token statistics and the footprint f(s) (docs/algorithms.md#footprint).

f(s) = context + expected output, where context = last prompt + last output + expected next
append (EWMA of appends) and expected output = EWMA of outputs. While a request is held its
prompt estimate replaces the context when larger (the request itself says how big the next
context is), and so does the prompt of a request in flight while it runs (without it a
session's first request counted as its expected output alone, so the planner filled the room
that request was using and had to pause someone when it ended). Before any request has completed the expected output is
``min(max_tokens, default_output_tokens)``.

ThunderAgent counts a program by what it holds now, not by a reservation for the next turn
(``program_tokens``, ``CoreConfig.accounting`` "program"); its baseline is run that way.
"""

from __future__ import annotations

from services.router.core.model import CoreConfig, Session, TokenStats


def _ewma(previous: float, sample: float, alpha: float, first: bool) -> float:
    return float(sample) if first else alpha * sample + (1.0 - alpha) * previous


def observe_request(stats: TokenStats, prompt_tokens: int, output_tokens: int, alpha: float) -> TokenStats:
    """Stats after a completed request of ``prompt_tokens`` in / ``output_tokens`` out.

    The append of turn i is its prompt minus the previous context (clamped at 0: a harness may
    truncate history). The first request has no previous context, so no append sample."""
    prompt_tokens = max(0, prompt_tokens)
    output_tokens = max(0, output_tokens)
    first = stats.requests == 0
    ewma_append = stats.ewma_append_tokens
    if not first:
        append = max(0, prompt_tokens - stats.context_tokens)
        ewma_append = _ewma(ewma_append, append, alpha, stats.requests == 1)
    return TokenStats(
        requests=stats.requests + 1,
        last_prompt_tokens=prompt_tokens,
        last_output_tokens=output_tokens,
        ewma_output_tokens=_ewma(stats.ewma_output_tokens, output_tokens, alpha, first),
        ewma_append_tokens=ewma_append,
    )


def expected_output_tokens(session: Session, config: CoreConfig) -> int:
    if session.tokens.requests > 0:
        expected = round(session.tokens.ewma_output_tokens)
    else:
        expected = config.default_output_tokens
    if session.pending_max_tokens is not None:
        expected = min(expected, session.pending_max_tokens)
    if session.in_flight > 0 and session.inflight_max_tokens is not None:
        expected = min(expected, session.inflight_max_tokens)
    return max(0, expected)


def footprint_tokens(session: Session, config: CoreConfig) -> int:
    """f(s) in tokens (see the module docstring); with ``config.accounting == "program"``,
    ThunderAgent's program tokens instead (``program_tokens``)."""
    if config.accounting == "program":
        return program_tokens(session, config)
    context = session.tokens.context_tokens + session.tokens.expected_append_tokens
    if session.held > 0:
        context = max(context, session.pending_prompt_tokens)
    if session.in_flight > 0:
        context = max(context, session.inflight_prompt_tokens)
    return context + expected_output_tokens(session, config)


def program_tokens(session: Session, config: CoreConfig) -> int:
    """ThunderAgent's count of a program's tokens (``CoreConfig.accounting`` "program"): the
    prompt + completion of its last request (vLLM's ``usage.total_tokens``), no expected next
    append; a held request's prompt; a running one's prompt plus its expected output."""
    tokens = session.tokens.context_tokens
    if session.held > 0:
        tokens = max(tokens, session.pending_prompt_tokens)
    if session.in_flight > 0:
        tokens = max(tokens, session.inflight_prompt_tokens + expected_output_tokens(session, config))
    return tokens
