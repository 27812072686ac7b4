"""Why is this session waiting? The operator's answer (pure: no I/O, times passed in).

``explain_session`` turns the router core's live state, the predictor's latest prediction for
the session (read from Redis by the adapter) and what the router knows about the plans it
follows into one ``SessionExplanation``: the session's phase, replica and footprint; its
cache credit per replica (k = k0 · 2^(−τ/10 s), docs/algorithms.md#cache-credit), its
readiness and the prediction behind it; why it is held (which plan, which constraint:
capacity on which replica, its place in the held queue and in the pool order, the tenant's
cap and headroom, a pause); and what would admit it. ``to_json`` is the HTTP answer of ``GET /v1/sessions/{id}``,
``to_text`` what ``tao explain`` prints. ``session_row`` is one line of ``tao sessions``.

Constraints (``SessionExplanation.constraint``), first match wins:
``running`` / ``admitted`` (nothing holds it), ``per_request`` (per-request policy, no replica),
``no_replica`` (no replica takes sessions, or none serving its model), ``replica_down`` (admitted on a failed replica),
``tenant_cap`` (its tenant is at its budget cap or limit), ``pause_pending`` (the plan marked
it to pause), ``no_live_plan`` (planner silent and no local fallback), ``capacity`` (its
footprint fits on no replica's free tokens), ``tenant_headroom`` (the planner sees no
headroom for its tenant), ``paused`` (a plan paused it), ``plan_order`` (it fits, but the
plan admitted others first or the next plan round has not run yet).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from services.common.core.evidence import CacheEvidence
from services.router.core.model import Replica
from services.router.core.readiness import FRESH_S, HORIZON_S, PredictionView, is_current, is_ready

if TYPE_CHECKING:
    from services.router.core.state import RouterCore

HALF_LIFE_S = 10.0  # docs/algorithms.md#cache-credit (the planner's values.HALF_LIFE_S)


@dataclass(frozen=True, slots=True)
class PredictionFacts:
    """The predictor's ``PredictionRecord`` fields an explanation shows (Unix seconds)."""

    call_id: str
    tool: str
    ready: bool
    ready_reason: str
    evidence: str
    expected_duration_s: float
    remaining_s: float
    started_at_unix_s: float
    refreshed_at_unix_s: float
    predicted_return_unix_s: float
    deadline_unix_s: float | None = None


@dataclass(frozen=True, slots=True)
class PlanFacts:
    """What the router knows about the plans it follows."""

    #: the last plan applied, e.g. "planner rev 12" or "fallback tao"; None before any
    source: str | None = None
    epoch: str | None = None
    revision: int | None = None
    #: model seconds since the planner's newest plan was made (None: never)
    age_s: float | None = None
    planner_silent: bool = False
    #: the local fallback policy (runs while the planner is silent)
    fallback: str = ""
    #: the local fallback ran within ``plan_stale_s``
    fallback_live: bool = False
    policy: str = ""


@dataclass(frozen=True, slots=True)
class ReplicaCredit:
    replica: str
    #: decayed credit k(s, n) now, in tokens (volume evidence scaled by the hit rate)
    credit_tokens: int
    #: the undecayed k0 and its evidence kind (None: no evidence there)
    k0_tokens: int
    evidence: str | None
    age_s: float | None
    #: admissible tokens not yet used on the replica, and whether the footprint fits there
    free_tokens: int
    #: healthy, not draining, capacity known, and serving the session's model
    takes_sessions: bool
    fits: bool


@dataclass(frozen=True, slots=True)
class Readiness:
    ready: bool
    #: held_request | prediction | prediction_stale | no_prediction | admitted
    source: str
    detail: str
    prediction: PredictionFacts | None = None
    #: the prediction is fresh and belongs to the session's current tool call
    current: bool = False
    #: model seconds until the predicted return (negative: overdue)
    returns_in_s: float | None = None


@dataclass(frozen=True, slots=True)
class TenantFacts:
    tenant: str
    in_flight: int
    held: int
    cap: int | None
    limit: int | None
    headroom: int | None
    slot_free: bool


@dataclass(frozen=True, slots=True)
class SessionExplanation:
    session: str
    tenant: str
    phase: str
    admitted: bool
    replica: str | None
    footprint_tokens: int
    context_tokens: int
    requests: int
    in_flight: int
    held_requests: int
    #: model seconds its oldest held request has waited (None: nothing held)
    waiting_s: float | None
    #: 1-based place of its first held request in the router's held queue (FIFO), of ``queue_length``
    queue_position: int | None
    queue_length: int
    #: 1-based rank in the pool (sessions not admitted) in the ready-first objective's order:
    #: a held request first, then best decayed credit, then longest waiting; of ``pool_size``
    pool_rank: int | None
    pool_size: int
    credits: tuple[ReplicaCredit, ...]
    readiness: Readiness
    tenant_facts: TenantFacts
    plan: PlanFacts
    held: bool
    constraint: str
    reason: str
    admit_when: tuple[str, ...] = field(default_factory=tuple)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["tenant_limits"] = out.pop("tenant_facts")
        out["object"] = "tao.session.explanation"
        return out

    def to_text(self) -> str:
        lines = [f"session {self.session} (tenant {self.tenant}): {self.phase}"
                 + (f" on {self.replica}" if self.replica else "")
                 + f", footprint {self.footprint_tokens} tokens, context {self.context_tokens}, "
                 f"{self.requests} request(s) done"]
        state = "HELD" if self.held else "not held"
        lines.append(f"  {state}: {self.reason}")
        if self.pool_rank is not None:
            lines.append(f"  pool order: {self.pool_rank} of {self.pool_size} (held request first, then credit, then "
                         "waiting time)")
        if self.queue_position is not None:
            lines.append(f"  held queue: position {self.queue_position} of {self.queue_length}, waiting "
                         f"{_secs(self.waiting_s)}")
        for w in self.admit_when:
            lines.append(f"  would admit it: {w}")
        r = self.readiness
        lines.append(f"  readiness: {'ready' if r.ready else 'not ready'} ({r.source}: {r.detail})")
        t = self.tenant_facts
        cap = "none" if t.cap is None else str(t.cap)
        lim = "" if t.limit is None or t.limit == t.cap else f", limit {t.limit}"
        head = "" if t.headroom is None else f", headroom {t.headroom}"
        lines.append(f"  tenant {t.tenant}: {t.in_flight} in flight, {t.held} held, cap {cap}{lim}{head}"
                     + ("" if t.slot_free else " (no slot free)"))
        p = self.plan
        plan = p.source or "none yet"
        rev = f" (epoch {p.epoch}, revision {p.revision})" if p.revision is not None else ""
        age = "" if p.age_s is None else f", newest planner plan {p.age_s:.1f} s old"
        silent = f"; planner silent, local fallback {p.fallback} admits" if p.planner_silent else ""
        lines.append(f"  plan: {plan}{rev}{age}, policy {p.policy}{silent}")
        lines.append("  credit per replica:")
        for c in self.credits:
            ev = "no evidence" if c.evidence is None else f"k0 {c.k0_tokens} ({c.evidence}, {_secs(c.age_s)} old)"
            status = "fits" if c.fits else ("does not fit" if c.takes_sessions else "takes no sessions")
            lines.append(f"    {c.replica:<20} k={c.credit_tokens:<8} {ev}; free {c.free_tokens} tokens, {status}")
        return "\n".join(lines)


def _secs(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f} s"


def _readiness(core: RouterCore, session_id: str, pred: PredictionFacts | None, now_unix_s: float,
               acting_since_unix_s: float | None) -> Readiness:
    s = core.sessions[session_id]
    returns_in = None if pred is None else pred.predicted_return_unix_s - now_unix_s
    if s.held > 0:
        return Readiness(True, "held_request", "a request is held: ready by definition", pred,
                         pred is not None and is_current(_view(pred), now_unix_s, acting_since_unix_s), returns_in)
    if pred is None:
        return Readiness(False, "no_prediction", "the predictor has no prediction for this session "
                         "(no tool events reported)")
    view = _view(pred)
    current = is_current(view, now_unix_s, acting_since_unix_s)
    if not current:
        why = ("older than the session's last request" if now_unix_s - pred.refreshed_at_unix_s <= FRESH_S
               else f"not refreshed for {now_unix_s - pred.refreshed_at_unix_s:.1f} s (> {FRESH_S:.0f} s)")
        return Readiness(False, "prediction_stale", f"prediction for {pred.tool} {why}: it does not count",
                         pred, False, returns_in)
    ready = is_ready(view, now_unix_s, acting_since_unix_s)
    if pred.ready:
        detail = f"predictor flagged {pred.tool} ready ({pred.ready_reason})"
    elif ready:
        detail = f"{pred.tool} returns within {HORIZON_S:.0f} s (predicted by {pred.evidence})"
    else:
        detail = (f"{pred.tool} expected to return in {returns_in:.1f} s (of {pred.expected_duration_s:.1f} s, "
                  f"predicted by {pred.evidence}); ready within {HORIZON_S:.0f} s of its return")
    return Readiness(ready, "prediction", detail, pred, True, returns_in)


def _view(p: PredictionFacts) -> PredictionView:
    return PredictionView(p.ready, p.started_at_unix_s, p.refreshed_at_unix_s, p.predicted_return_unix_s,
                          p.deadline_unix_s)


def _credits(core: RouterCore, session_id: str, now_s: float) -> tuple[ReplicaCredit, ...]:
    s = core.sessions[session_id]
    out = []
    for rid in sorted(core.replicas):
        rep = core.replicas[rid]
        # the planner's pick: kv_events first (values.raw_credit_matrix)
        ev = min((e for e in s.cache if e.replica == rid), key=lambda e: e.kind != "kv_events", default=None)
        k0, k = (0, 0) if ev is None else _decayed(ev, rep, now_s)
        age = None if ev is None else max(0.0, now_s - ev.observed_at_s)
        takes = core.eligible(rep) and rep.serves(s.model)
        free = max(0, core.capacity(rid) - core.used.get(rid, 0)) if takes else 0
        mine = s.footprint_tokens if s.admitted and s.replica == rid else 0
        fits = takes and (mine > 0 or s.footprint_tokens <= free)
        out.append(ReplicaCredit(rid, k, k0, None if ev is None else ev.kind, age, free, takes, fits))
    return tuple(out)


def _decayed(e: CacheEvidence, rep: Replica, now_s: float) -> tuple[int, int]:
    """(k0, k now) of one piece of evidence, as the planner values it (values.credit_matrix)."""
    k0 = e.credit_tokens
    if e.kind == "volume":
        k0 = math.floor(k0 * min(1.0, max(0.0, rep.prefix_hit_rate)))
    if e.kind == "kv_events":  # the replica's residency now: not decayed
        return k0, k0
    return k0, math.floor(k0 * 2.0 ** (-max(0.0, now_s - e.observed_at_s) / HALF_LIFE_S))


def _best_credit(core: RouterCore, session_id: str, now_s: float) -> int:
    best = 0
    s = core.sessions[session_id]
    for e in s.cache:
        rep = core.replicas.get(e.replica)
        if rep is not None and core.eligible(rep) and rep.serves(s.model):
            best = max(best, _decayed(e, rep, now_s)[1])
    return best


def _tenant(core: RouterCore, tenant: str) -> TenantFacts:
    caps = core.caps or {}
    limits = core.limits or {}
    headroom = core.tenant_headroom()
    return TenantFacts(tenant, core.tenant_in_flight.get(tenant, 0), core.tenant_held.get(tenant, 0),
                       caps.get(tenant), limits.get(tenant) if tenant in caps else None,
                       None if headroom is None else headroom.get(tenant), core._slot_free(tenant))


def explain_session(core: RouterCore, session_id: str, now_s: float, now_unix_s: float, *,
                    prediction: PredictionFacts | None = None, plan: PlanFacts | None = None,
                    acting_since_unix_s: float | None = None) -> SessionExplanation:
    """Explain ``session_id`` (``KeyError`` when the core has no such session). ``now_s`` is
    the router clock, ``now_unix_s`` the shared Unix clock (model time) predictions use;
    ``acting_since_unix_s`` is when the session's last request ended, in Unix seconds."""
    s = core.sessions[session_id]
    plan = plan or PlanFacts()
    phase = core.phase(s)
    credits = _credits(core, session_id, now_s)
    readiness = _readiness(core, session_id, prediction, now_unix_s, acting_since_unix_s)
    tenant = _tenant(core, s.tenant)
    queue = list(core.held.values())
    position = next((i + 1 for i, h in enumerate(queue) if h.session_id == session_id), None)
    waiting = None if s.waiting_since_s is None else max(0.0, now_s - s.waiting_since_s)
    pool = sorted((p for p in core.sessions.values() if not p.admitted),
                  key=lambda p: (-(p.held > 0), -_best_credit(core, p.id, now_s),
                                 p.waiting_since_s if p.waiting_since_s is not None else now_s, p.id))
    rank = next((i + 1 for i, p in enumerate(pool) if p.id == session_id), None)
    constraint, reason, admit = _constraint(core, session_id, phase, credits, tenant, plan, readiness)
    held = constraint not in ("running", "admitted")
    return SessionExplanation(
        session=s.id, tenant=s.tenant, phase=phase, admitted=s.admitted, replica=s.replica,
        footprint_tokens=s.footprint_tokens, context_tokens=s.tokens.context_tokens, requests=s.tokens.requests,
        in_flight=s.in_flight, held_requests=s.held, waiting_s=waiting, queue_position=position,
        queue_length=len(queue), pool_rank=rank, pool_size=len(pool), credits=credits, readiness=readiness, tenant_facts=tenant, plan=plan,
        held=held, constraint=constraint, reason=reason, admit_when=admit,
    )


def _constraint(core: RouterCore, sid: str, phase: str, credits: tuple[ReplicaCredit, ...], tenant: TenantFacts,
                plan: PlanFacts, readiness: Readiness) -> tuple[str, str, tuple[str, ...]]:
    s = core.sessions[sid]
    by_plan = plan.source or "no plan yet"
    rejected = core.last_reject.get(sid)
    if phase == "RUNNING":
        text = f"running on {s.replica}: {s.in_flight} request(s) in flight"
        if s.pause_pending:
            text += f"; a plan (last applied: {by_plan}) pauses it when its request ends"
        return "running", text, ()
    if not core.config.gating:
        if s.held == 0:
            return "admitted", "between requests; a per-request policy routes each request at once", ()
        return "per_request", f"per-request policy {plan.policy}: {rejected or 'no replica can take it'}", (
            "a healthy replica",)
    if s.admitted and s.held == 0 and not s.pause_pending:
        return "admitted", f"admitted on {s.replica} (last plan applied: {by_plan}); between requests (a tool " \
                           "runs), its next request goes straight through", ()
    if not any(c.takes_sessions for c in credits):
        if s.model and any(core.eligible(r) for r in core.replicas.values()):
            return "no_replica", f"no replica that takes sessions serves model {s.model}", (
                f"a healthy replica serving {s.model} (check the replicas' /v1/models)",)
        return "no_replica", "no replica takes sessions (none healthy with a known KV capacity)", (
            "a replica becoming healthy (check `GET /health` and the replicas' /health)",)
    if s.admitted and s.replica is not None:
        rep = core.replicas.get(s.replica)
        if rep is None or not rep.healthy:
            return "replica_down", f"admitted on {s.replica}, which is down", (
                "the next plan re-placing it on a healthy replica",)
    if not tenant.slot_free:
        lim = tenant.limit if tenant.limit is not None else tenant.cap
        return "tenant_cap", (f"tenant {s.tenant} is at its budget cap: {tenant.in_flight} in flight, cap "
                              f"{tenant.cap}, limit {lim}"), (
            f"a request of tenant {s.tenant} ending (frees a slot)",
            f"the budget service raising tenant {s.tenant}'s cap (next allocation)")
    if s.pause_pending:
        return "pause_pending", f"marked by a plan to pause on {s.replica} (last plan applied: {by_plan})", (
            "a later plan admitting it again",)
    if s.admitted:
        return "admitted", f"admitted on {s.replica} (last plan applied: {by_plan}); its held request is about " \
                           "to be forwarded", ()
    if plan.planner_silent and not plan.fallback_live:
        return "no_live_plan", "no live plan: the planner is silent and the local fallback has not run yet", (
            "the planner publishing a plan, or the local fallback running",)
    fitting = [c for c in credits if c.fits]
    best = max(credits, key=lambda c: (c.takes_sessions, c.credit_tokens, c.free_tokens, c.replica))
    admit: list[str] = []
    if not fitting:
        roomiest = max((c for c in credits if c.takes_sessions), key=lambda c: (c.free_tokens, c.replica))
        short = s.footprint_tokens - roomiest.free_tokens
        if best.credit_tokens > 0 and best.replica != roomiest.replica:
            admit.append(f"{s.footprint_tokens - best.free_tokens} tokens freed on {best.replica} (its best "
                         f"credit, k={best.credit_tokens})")
        admit.append(f"{short} tokens freed on {roomiest.replica} (sessions there ending or being paused)")
        return "capacity", (f"fits nowhere: footprint {s.footprint_tokens} tokens, the most free is "
                            f"{roomiest.free_tokens} on {roomiest.replica} ({by_plan})"), tuple(admit)
    if tenant.headroom is not None and tenant.headroom <= 0:
        return "tenant_headroom", f"the planner sees no headroom for tenant {s.tenant} ({by_plan})", (
            f"a request of tenant {s.tenant} ending",)
    target = max(fitting, key=lambda c: (c.credit_tokens, c.free_tokens, c.replica))
    if rejected and rejected.startswith("paused by plan"):
        constraint, reason = "paused", f"{rejected}; it fits on {target.replica} now ({target.free_tokens} free)"
    else:
        extra = f"; last rejection: {rejected}" if rejected else ""
        constraint, reason = "plan_order", (
            f"it fits on {target.replica} ({target.free_tokens} free tokens, k={target.credit_tokens}) but "
            f"{by_plan} did not admit it: the objective preferred others or the next round has not run{extra}")
    if readiness.ready:
        admit.append(f"the next plan round (it is ready; {plan.policy} admits ready sessions first)")
    else:
        admit.append("its tool returning (readiness), then the next plan round")
    return constraint, reason, tuple(admit)


def session_row(core: RouterCore, session_id: str, now_s: float) -> dict[str, Any]:
    """One row of ``tao sessions`` (``kubectl get``-like)."""
    s = core.sessions[session_id]
    waiting = None if s.waiting_since_s is None else round(max(0.0, now_s - s.waiting_since_s), 3)
    return {"session": s.id, "tenant": s.tenant, "phase": core.phase(s), "replica": s.replica,
            "admitted": s.admitted, "footprint_tokens": s.footprint_tokens, "requests": s.tokens.requests,
            "in_flight": s.in_flight, "held": s.held, "waiting_s": waiting,
            "age_s": round(max(0.0, now_s - s.created_s), 3), "model": s.model}
