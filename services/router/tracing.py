"""The router's own spans (``services.common.tracing``; all no-ops while tracing is off).

The aiohttp-server instrumentation makes the request's SERVER span (continuing the client's
``traceparent``); under it the router adds ``router.hold`` (while the request waits for
admission: the hold kind and reason when it was held, the plan that released it) and one
``router.upstream`` CLIENT span per attempt (replica, attempt, status, a ``first_byte`` event;
its context goes to the replica as ``traceparent``), ending when the answer has been relayed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from services.common import tracing
from services.router.core.hold import hold_kind

if TYPE_CHECKING:
    from services.router.runtime import RouterRuntime

SCOPE = "tao.router"


def annotate(request_id: str, session_id: str, tenant: str) -> None:
    """Name the request, session and tenant on the current (SERVER) span."""
    if tracing.enabled():
        from opentelemetry import trace

        trace.get_current_span().set_attributes(
            {"tao.request_id": request_id, "tao.session_id": session_id, "tao.tenant": tenant})


def start_hold(rt: RouterRuntime, request_id: str, cause: str = "arrival") -> Any:
    """A ``router.hold`` span for a request that was just held (None while tracing is off)."""
    tr = tracing.tracer(SCOPE)
    if tr is None:
        return None
    kind, why = hold_kind(rt.core, request_id, rt.plans_live())
    return tr.start_span("router.hold", attributes={"tao.hold.kind": kind, "tao.hold.reason": why,
                                                    "tao.hold.cause": cause})


def end_hold(rt: RouterRuntime, span: Any, error: str | None = None) -> None:
    """End a hold span: the plan in force when it was released, or the error that ended it."""
    if span is None:
        return
    from services.router.sessions_http import plan_facts

    facts = plan_facts(rt)
    attrs: dict[str, Any] = {"tao.plan.source": facts.source or "none"}
    if facts.revision is not None:
        attrs["tao.plan.revision"] = facts.revision
    if facts.epoch is not None:
        attrs["tao.plan.epoch"] = facts.epoch
    span.set_attributes(attrs)
    if error is not None:
        from opentelemetry.trace import Status, StatusCode

        span.set_status(Status(StatusCode.ERROR, error))
    span.end()


def start_attempt(replica: str, attempt: int) -> Any:
    """The current ``router.upstream`` CLIENT span of one attempt (use ``with``)."""
    from opentelemetry.trace import SpanKind

    return tracing.tracer(SCOPE).start_as_current_span(
        "router.upstream", kind=SpanKind.CLIENT, attributes={"tao.replica": replica, "tao.attempt": attempt})
