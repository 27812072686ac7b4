"""Tool events from answers (issue: sessions whose harness has no ``ToolReporter``).

The proxy reads each answer's tool calls (``core/tools.py``); ``ToolEvents`` reports them to
the predictor with the predictor's own ``AsyncToolReporter`` (buffered, never blocking, resent
after reconnects): ``started`` when the answer ends (the session now acts), ``finished`` when
the session's next request arrives (it carries the tool's result). A session that ends with
calls still open (released, or idle past its TTL) has them forgotten, not finished: that would
teach the predictor a duration that was no tool's. A harness that reports its own tool events
wins: the predictor ignores these inferred calls for its sessions (``INFERRED_CALL_PREFIX``).

Off unless ``predictor_address`` is set (and ``tool_events`` is on); detection is counted in
``tao_router_tool_calls_detected_total`` either way.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

import structlog
from prometheus_client import CollectorRegistry, Counter

from services.predictor.reporter import AsyncToolReporter
from services.predictor.reporter import ToolCall as ReportedCall
from services.router.core.tools import ToolCall
from services.router.settings import Settings

MAX_OPEN_SESSIONS = 100_000  # sessions with calls open; past it, those that ended are forgotten


class ToolEvents:
    def __init__(self, settings: Settings, clock_unix: Callable[[], float], registry: CollectorRegistry,
                 log: structlog.stdlib.BoundLogger) -> None:
        self.log = log
        self.detected = Counter("tao_router_tool_calls_detected", "Tool calls read from replicas' answers.",
                                registry=registry)
        self.reporter: AsyncToolReporter | None = None
        if settings.predictor_address and settings.tool_events:
            token = settings.auth_token.get_secret_value() if settings.auth_token else None
            self.reporter = AsyncToolReporter(settings.predictor_address, runner_id="tao-router", token=token,
                                              ca_file=settings.predictor_ca_file, clock=clock_unix)
        self._open: OrderedDict[str, list[ReportedCall]] = OrderedDict()

    async def start(self) -> None:
        if self.reporter is not None:
            await self.reporter.start()

    async def close(self) -> None:
        if self.reporter is not None:
            await self.reporter.close(timeout_s=1.0)

    def started(self, session_id: str, calls: tuple[ToolCall, ...], alive: Callable[[str], bool]) -> None:
        """An answer of ``session_id`` called ``calls``: they run from now."""
        self.detected.inc(len(calls))
        reporter = self.reporter
        if reporter is None:
            return
        self.next_request(session_id)  # two answers in a row (parallel requests): the older calls ended
        self._open[session_id] = [reporter.start_call(session_id, c.name, c.command, call_id=c.call_id)
                                  for c in calls]
        if len(self._open) > MAX_OPEN_SESSIONS:
            for sid in [s for s in self._open if not alive(s)]:
                self.ended(sid)
            while len(self._open) > MAX_OPEN_SESSIONS:
                self.ended(next(iter(self._open)))

    def next_request(self, session_id: str) -> None:
        """A request of ``session_id`` arrived: the tools its last answer called have returned."""
        if not self._open:
            return
        for call in self._open.pop(session_id, ()):
            call.finish()

    def ended(self, session_id: str) -> None:
        """``session_id`` ended: its open calls will never return (forgotten, not finished)."""
        calls = self._open.pop(session_id, None)
        if calls and self.reporter is not None:
            for call in calls:
                self.reporter.forget(session_id, call.call_id)
