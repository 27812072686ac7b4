"""Per-session bookkeeping of the simulated agent harness.

Admission, placement, footprints and cache evidence live in the router core
(``services.router.core.RouterCore``); this is only what the harness and the metrics need:
which turn comes next, the token content, timestamps, the true tool end (the oracle's
readiness) and the pause flags the metrics report.

``phase`` here is the harness's view: ``PENDING`` (not yet picked up by a closed-loop worker),
``WAITING`` (request sent, not yet forwarded), ``RUNNING``, ``ACTING`` (tool running), ``ENDED``.
Invariant: ``last_prompt_tokens + last_output_tokens`` is the context after the last request,
so turn i's prompt = that context + turn i's append (exact integers, as the trace defines).
"""

from __future__ import annotations

from dataclasses import dataclass

from services.sim.engine.tokens import SyntheticContent
from services.sim.workload.trace import TraceSession


@dataclass(slots=True)
class SimSession:
    trace: TraceSession
    order: int  # position in arrival order (closed-loop start order)
    content: SyntheticContent | None = None
    phase: str = "PENDING"
    turn: int = 0  # the turn whose request is next / in flight
    replica: str | None = None  # replica of the last forwarded request
    start_s: float = 0.0
    ready_s: float = 0.0  # when the current request was sent by the harness
    forwarded_s: float = 0.0
    first_token_s: float = -1.0
    tool_end_s: float = 0.0  # truth, for the oracle only
    last_prompt_tokens: int = 0
    last_output_tokens: int = 0
    paused_wait: bool = False  # the current request was sent while the session was paused
    paused_since_request: bool = False  # paused since its last request was forwarded
    after_pause_flag: bool = False  # the in-flight request follows a pause

    @property
    def id(self) -> str:
        return self.trace.session_id

    @property
    def context_tokens(self) -> int:
        return self.last_prompt_tokens + self.last_output_tokens

    def prompt_tokens_of(self, turn: int) -> int:
        """Prompt of ``turn``: the previous context plus this turn's append."""
        if turn == 0:
            return self.trace.system_prompt_tokens + self.trace.turns[0].append_tokens
        return self.context_tokens + self.trace.turns[turn].append_tokens
