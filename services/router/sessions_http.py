"""Operators' HTTP view of sessions (thin adapter over ``core/explain.py``).

``GET /v1/sessions`` lists sessions (``?tenant=``, ``?phase=``, ``?limit=``), ``GET
/v1/sessions/{id}`` explains one, in words (``text``) and in JSON. Who sees what: in dev
mode (no keys file) every session; with a keys file a tenant's key sees its own sessions,
and the router's admin token (``admin_token``, default ``auth_token``) sees them all. A
session id that is not 1-256 printable characters is a 400, an unknown session (or one of
another tenant) a 404 ``session_not_found``, both OpenAI-style bodies. The predictor's
prediction for the session is read from Redis (``keys.PREDICTIONS``, read only, bounded
wait: without Redis the explanation says there is no prediction).
"""

from __future__ import annotations

from typing import Any

from redis.exceptions import RedisError

from services.common import keys
from services.common.aio import reraise_if_cancelling, within
from services.common.records import PredictionRecord, RecordError, load
from services.router.core.explain import PlanFacts, PredictionFacts, explain_session, session_row
from services.router.runtime import RouterRuntime
from services.router.validation import RequestError

PHASES = ("WAITING", "RUNNING", "ACTING", "PAUSED")
MAX_LIST = 10_000


def plan_facts(rt: RouterRuntime) -> PlanFacts:
    applied = rt.plans.fence.applied
    silent = rt.core.config.gating and rt.planner_silent()
    fallback_live = rt.now() - rt.fallback_fresh_s <= rt.settings.plan_stale_s
    rec = rt.last_plan
    if silent and fallback_live:
        source: str | None = f"fallback {rt.fallback.name}"
    elif rec is not None:
        source = f"planner rev {rec.rev}"
    else:
        source = None
    age = None if rec is None else max(0.0, rt.clock.unix() - rec.created_at_unix_s)
    return PlanFacts(source=source, epoch=applied.epoch if applied else None,
                     revision=applied.rev if applied else None, age_s=age, planner_silent=silent,
                     fallback=rt.fallback.name, fallback_live=fallback_live, policy=rt.policy.name)


async def prediction_of(rt: RouterRuntime, session_id: str) -> PredictionFacts | None:
    try:
        raw = await within(rt.ctx.redis.hget(keys.PREDICTIONS, session_id), 0.25)
    except (TimeoutError, RedisError, OSError):
        reraise_if_cancelling()
        return None
    if raw is None:
        return None
    try:
        p = load(PredictionRecord, raw)
    except RecordError:
        return None
    return PredictionFacts(p.call_id, p.tool, p.ready, p.ready_reason, p.evidence, p.expected_duration_s,
                           p.remaining_s, p.started_at_unix_s, p.refreshed_at_unix_s, p.predicted_return_unix_s,
                           p.deadline_unix_s)


async def explain(rt: RouterRuntime, session_id: str, tenant: str | None) -> dict[str, Any]:
    """The JSON answer for one session; ``tenant`` None: any tenant's session."""
    s = rt.core.sessions.get(session_id)
    if s is None or (tenant is not None and s.tenant != tenant):
        raise RequestError(404, f"unknown session {session_id!r}", param="session_id", code="session_not_found")
    pred = await prediction_of(rt, session_id)
    s = rt.core.sessions.get(session_id)  # it may have ended while Redis answered
    if s is None:
        raise RequestError(404, f"unknown session {session_id!r}", param="session_id", code="session_not_found")
    acting = None if s.acting_since_s is None else rt.to_unix(s.acting_since_s)
    ex = explain_session(rt.core, session_id, rt.now(), rt.clock.unix(), prediction=pred, plan=plan_facts(rt),
                         acting_since_unix_s=acting)
    return {**ex.to_json(), "text": ex.to_text()}


def list_sessions(rt: RouterRuntime, tenant: str | None, query: dict[str, str]) -> dict[str, Any]:
    phase = query.get("phase", "").upper()
    if phase and phase not in PHASES:
        raise RequestError(400, f"'phase' must be one of {', '.join(PHASES)}", param="phase", code="invalid_value")
    try:
        limit = int(query.get("limit", MAX_LIST))
    except ValueError:
        limit = -1
    if not 1 <= limit <= MAX_LIST:
        raise RequestError(400, f"'limit' must be an integer in [1, {MAX_LIST}]", param="limit", code="invalid_value")
    want_tenant = query.get("tenant") or None
    core, now = rt.core, rt.now()
    rows = []
    for sid in sorted(core.sessions):
        s = core.sessions[sid]
        if (tenant is not None and s.tenant != tenant) or (want_tenant and s.tenant != want_tenant):
            continue
        if phase and core.phase(s) != phase:
            continue
        rows.append(session_row(core, sid, now))
        if len(rows) >= limit:
            break
    return {"object": "list", "data": rows}
