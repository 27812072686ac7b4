"""Plan revalidation and application, and the human-readable admission reason
(docs/algorithms.md#plan-revalidation).

A plan was computed from a snapshot that is already old when it arrives. Each part is
applied only if it still holds against live state:
- pauses first (they free room for the assignments, as the planner assumed): the session
  must still be admitted and not re-placed since the snapshot, and (``pause_revalidation``)
  its replica must still be over capacity once the footprints of sessions already leaving
  are subtracted — those paused earlier in this plan and RUNNING ones already marked
  (``pause_pending``) — and the footprints of this plan's assignments there that still hold
  are added: a pause that makes room for the plan's own admission (a reclaim: ``tao-ttl``,
  ``tao-reclaim``, ``tao-idle``) is as needed as one that ends an excess — while its session is
  still between requests. A reclaim takes the reservation of a session whose tool runs; if that
  session has sent its next request since (it holds one now), its replica would be over
  capacity only through the plan's own assignments, and the pause is dropped (those
  assignments then find no room): it would otherwise pause a session that is decoding again, at
  its request's end, for an admission that cannot happen before then (``drop_resumed_reclaims``,
  set by the ``tao`` policies; Continuum's TTL expiry unpins whatever the session does next,
  as its engine does). A live plan reaches the router 0.1–0.25 model seconds after the
  planner read its snapshot (``tao_router_plan_age_seconds`` p50 / p90 at time scale 20), and
  the router's write-behind can hold a change up to one flush interval before that: together
  about as long as a short agent tool (p50 0.75 s on terminal-bench). The planner's snapshot does not
  say which RUNNING sessions are marked, so a policy re-planning while a marked request
  still runs asks again for the same excess;
  upstream ThunderAgent avoids the same double count with its ``future_paused_tokens``.
  ACTING (and admitted but held) sessions leave at once; RUNNING ones are marked and leave
  when their request ends — nothing in flight is ever cut;
- then assignments, in plan order: the session still exists, is unplaced, not RUNNING, and
  its placement has not changed since the snapshot; the replica is known, healthy, not
  draining, serves the session's model, has a known capacity and room for the session's
  footprint now (with ``CoreConfig.lend``, room counts the reservations of the sessions
  admitted there that are between requests: a ``tao-lend`` loan), and has not just failed
  under this session.
Plan-level fencing (epoch + revision, ``services.common.epoch.StampFence``) happens before,
in the adapter, for planner plans; the local fallback's plans are not stamped.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from services.router.core.model import ApplyReport, PlanDecision

if TYPE_CHECKING:
    from services.router.core.state import RouterCore


#: why a plan's pause is dropped by revalidation (the pause is no longer needed, not refused)
PAUSE_ALREADY_MARKED = "pause: already marked"
PAUSE_NOT_NEEDED = "pause: replica no longer over capacity"
PAUSE_RESUMED = "pause: session resumed, its reservation is no longer free to reclaim"
PAUSE_DROPPED = frozenset({PAUSE_ALREADY_MARKED, PAUSE_NOT_NEEDED, PAUSE_RESUMED})
#: ``outcome`` label of ``tao_router_plan_parts_total`` per dropped pause's reason
PAUSE_DROP_OUTCOME = {PAUSE_ALREADY_MARKED: "pause_dropped_marked", PAUSE_NOT_NEEDED: "pause_dropped_not_needed",
                      PAUSE_RESUMED: "pause_dropped_resumed"}


def outcome_counts(report: ApplyReport) -> dict[str, int]:
    """A plan's parts by outcome: admitted, paused, pause_deferred, a dropped pause's
    ``PAUSE_DROP_OUTCOME``, rejected (an assignment, or a pause refused for another reason)."""
    counts = {"admitted": len(report.admitted), "paused": len(report.paused),
              "pause_deferred": len(report.pause_deferred)}
    for _, why in report.rejected:
        key = PAUSE_DROP_OUTCOME.get(why, "rejected")
        counts[key] = counts.get(key, 0) + 1
    return {k: n for k, n in counts.items() if n}


def apply_plan(core: RouterCore, now_s: float, plan: PlanDecision) -> ApplyReport:
    if not core.config.gating:
        reason = "per-request policy: plans are not used"
        return ApplyReport(rejected=tuple((a[0], reason) for a in plan.assignments))
    rejected: list[tuple[str, str]] = []
    paused: list[str] = []
    deferred: list[str] = []
    admitted: list[tuple[str, str]] = []
    excess = base = None
    if core.config.pause_revalidation and plan.pauses:
        base = _excess(core)
        excess = _with_assignments(core, plan, base)
    for sid in plan.pauses:
        s = core.sessions.get(sid)
        if s is None or not s.admitted:
            rejected.append((sid, "pause: not admitted"))
            continue
        if s.placed_s > plan.snapshot_at_s:
            rejected.append((sid, "pause: placement changed after the snapshot"))
            continue
        if s.pause_pending:
            rejected.append((sid, PAUSE_ALREADY_MARKED))
            continue
        if excess is not None and base is not None and s.replica is not None:
            if excess.get(s.replica, 0) <= 0:
                rejected.append((sid, PAUSE_NOT_NEEDED))
                continue
            if core.config.drop_resumed_reclaims and not s.idle and base.get(s.replica, 0) <= 0:
                rejected.append((sid, PAUSE_RESUMED))
                continue
            excess[s.replica] -= s.footprint_tokens
            base[s.replica] -= s.footprint_tokens
        if s.in_flight > 0:
            core._put(replace(s, pause_pending=True))
            deferred.append(sid)
        else:
            core._put(core._unadmit(s, now_s))
            core.last_reject[sid] = f"paused by plan ({plan.source})"
            paused.append(sid)
    for sid, rid in plan.assignments:
        problem = _check_assignment(core, sid, rid, plan.snapshot_at_s)
        if problem is not None:
            rejected.append((sid, problem))
            if sid in core.sessions:
                core.last_reject[sid] = f"plan ({plan.source}) rejected: {problem}"
            continue
        s = core.sessions[sid]
        core._admit(s, rid, now_s)
        core.last_reject.pop(sid, None)
        admitted.append((sid, rid))
    return ApplyReport(tuple(admitted), tuple(paused), tuple(deferred), tuple(rejected))


def _excess(core: RouterCore) -> dict[str, int]:
    """Tokens per replica above capacity, counting marked RUNNING sessions as already gone."""
    excess = {rid: core.used.get(rid, 0) - core.capacity(rid) for rid in core.replicas}
    for s in core.sessions.values():
        if s.admitted and s.pause_pending and s.replica in excess:
            excess[s.replica] -= s.footprint_tokens
    return excess


def _with_assignments(core: RouterCore, plan: PlanDecision, base: dict[str, int]) -> dict[str, int]:
    """``base`` plus the footprints of the plan's assignments that still hold (all but room)."""
    excess = dict(base)
    for sid, rid in plan.assignments:
        if rid in excess and _check_assignment(core, sid, rid, plan.snapshot_at_s, room=False) is None:
            excess[rid] += core.sessions[sid].footprint_tokens
    return excess


def _check_assignment(core: RouterCore, sid: str, rid: str, snapshot_at_s: float,
                      room: bool = True) -> str | None:
    """Why the assignment cannot be applied now (None: it can); ``room=False`` skips the free-room
    check (the pauses of the same plan are still to make it)."""
    s = core.sessions.get(sid)
    if s is None:
        return "session unknown or ended"
    if s.admitted:
        return f"already admitted on {s.replica}"
    if s.in_flight > 0:
        return "request in flight"
    if s.placed_s > snapshot_at_s:
        return "placement changed after the snapshot"
    rep = core.replicas.get(rid)
    if rep is None:
        return f"unknown replica {rid}"
    if not rep.healthy:
        return f"replica {rid} unhealthy"
    if rep.draining:
        return f"replica {rid} draining"
    if rep.kv_capacity_tokens <= 0:
        return f"replica {rid} capacity unknown"
    if rid in s.avoid:
        return f"replica {rid} failed under this session"
    if not rep.serves(s.model):
        return f"replica {rid} does not serve model {s.model}"
    if not room:
        return None
    free = core.capacity(rid) - core.used.get(rid, 0)
    if core.config.lend:  # a loan: the reservations of sessions between requests there count too
        free += sum(o.footprint_tokens for o in core.sessions.values()
                    if o.admitted and o.replica == rid and o.idle and not o.pause_pending)
    if s.footprint_tokens > free:
        return f"no room on {rid}: footprint {s.footprint_tokens} > free {free} tokens"
    return None


def explain(core: RouterCore, session_id: str) -> str:
    """Why the session is (not) admitted / (not) forwarded right now."""
    s = core.sessions.get(session_id)
    if s is None:
        return "unknown or ended"
    phase = core.phase(s)
    extra = core.last_reject.get(session_id)
    if phase == "RUNNING":
        text = f"running on {s.replica or 'a failed replica'}: {s.in_flight} request(s) in flight"
        if s.pause_pending:
            text += "; pauses when its request ends"
        return text
    if phase == "WAITING":
        if s.admitted and s.replica is not None:
            rep = core.replicas.get(s.replica)
            if rep is None or not rep.healthy:
                return f"held: replica {s.replica} unhealthy"
            if s.pause_pending:
                return "held: pause pending"
            cap = (core.caps or {}).get(s.tenant)
            if cap is not None and core.tenant_in_flight.get(s.tenant, 0) >= cap:
                return f"held: tenant {s.tenant} at cap {cap}"
            return f"held: about to be forwarded to {s.replica}"
        if not core.config.gating:
            return f"held: {extra or 'no healthy replica'}"
        return "held: waiting for admission" + (f" ({extra})" if extra else "")
    if s.admitted:
        return f"admitted on {s.replica}; between requests"
    if phase == "ACTING":
        return "between requests; routed per request"
    return "paused: not admitted; its next request will be held" + (f" ({extra})" if extra else "")
