"""Adapts the predictor's asynchronous ToolReporter to the driver's ToolEvents."""

from __future__ import annotations

from typing import Any


class ReporterToolEvents:
    """Streams the driver's tool calls to a predictor at ``address`` (host:port)."""

    def __init__(self, address: str, token: str | None = None, time_scale: float = 1.0) -> None:
        import time

        from services.predictor.reporter import AsyncToolReporter

        # events are stamped in model time, as the services' ScaledClock reads it
        self._reporter: Any = AsyncToolReporter(address, token=token, clock=lambda: time.time() * time_scale,
                                                runner_id="tao-bench-e2e")
        self._calls: dict[str, Any] = {}

    async def started(self, session_id: str, call_id: str, tool: str, command: str,
                      deadline_s: float | None) -> None:
        call = self._reporter.start_call(session_id, tool, command, deadline_s=deadline_s, call_id=call_id)
        self._calls[call_id] = call

    async def progress(self, session_id: str, call_id: str, fraction: float | None, eta_s: float | None) -> None:
        call = self._calls.get(call_id)
        if call is not None:
            call.progress(fraction=fraction, eta_s=eta_s)

    async def finished(self, session_id: str, call_id: str) -> None:
        call = self._calls.pop(call_id, None)
        if call is not None:
            call.finish()

    async def close(self) -> None:
        await self._reporter.aclose()
