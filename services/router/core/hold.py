"""Why a request is held: deliberately by the plan, or because nothing can serve it (pure).

An admission-gating router holds a session's request until a plan admits the session. Two
kinds of holding are told apart, because they deserve different patience:

- ``PLAN``: the plan keeps the session waiting on purpose. The session is in the pool (not
  admitted) while plans are live — the planner published one within ``plan_stale_s`` or the
  local fallback ran — with at least one replica that can take sessions and a free slot for
  the tenant; or it is admitted but marked to pause. As in ThunderAgent, such a request is
  held until the plan admits it, up to a generous bound (``plan_hold_timeout_s``) that scales
  with the model-time tool durations other sessions spend between requests.
- ``STUCK``: nothing can serve it now — no replica takes sessions, the session's replica is
  down, no replica that takes sessions serves the request's model, plans are not live
  (planner silent and the local fallback failing), the tenant is at
  its budget cap (overload), or a per-request policy found no replica. Such a request gets
  503 + ``Retry-After`` after the short ``hold_timeout_s``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from services.router.core.state import RouterCore

PLAN = "plan"
STUCK = "stuck"


def hold_kind(core: RouterCore, request_id: str, plans_live: bool) -> tuple[str, str]:
    """(``PLAN`` or ``STUCK``, why) for a held request; ``plans_live``: a fresh plan from the
    planner or a working local fallback. A request no longer held is ``STUCK`` (the caller's
    wait has then already ended)."""
    held = core.held.get(request_id)
    if held is None:
        return STUCK, "not held"
    s = core.sessions.get(held.session_id)
    if s is None:
        return STUCK, "session unknown or ended"
    if not core.config.gating:
        return STUCK, "per-request policy: " + (core.last_reject.get(s.id) or "no replica can take it")
    if not any(core.eligible(r) for r in core.replicas.values()):
        return STUCK, "no replica can take sessions"
    if not any(core.eligible(r) and r.serves(held.model) for r in core.replicas.values()):
        return STUCK, f"no replica that can take sessions serves model {held.model}"
    if not core._slot_free(s.tenant):
        return STUCK, f"tenant {s.tenant} at its budget cap {(core.caps or {}).get(s.tenant)}"
    if s.admitted:
        if s.pause_pending:
            return PLAN, "marked to pause by the plan"
        rep = core.replicas.get(s.replica) if s.replica is not None else None
        if rep is None or not rep.healthy:
            return STUCK, f"replica {s.replica} unhealthy"
        return STUCK, "admitted but not forwardable (its replica failed under this request)"
    if not plans_live:
        return STUCK, "no live plan: planner silent and the local fallback not running"
    return PLAN, "waiting for admission by the plan"
