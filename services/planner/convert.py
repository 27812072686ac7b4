"""The one place planner values change shape: proto <-> core, Redis records -> core, core -> record.

``PlannerPlanRecord`` extends the shared ``PlanRecord`` with the planner's diagnostics;
readers that know only ``PlanRecord`` ignore the extra fields.

Snapshot from records (``snapshot_from_records``), as the router itself would build it:
- replicas: healthy for the planner only when healthy and not draining;
- sessions: ENDED ones are left out; a session admitted on a replica that is not in the
  replica table goes back to the pool (its replica is gone); footprint falls back to
  context + expected append + EWMA output when the router has not computed one;
- credit evidence: the stored ``CacheEvidence`` of the replicas still in the table, as is
  (its ``credit_tokens``: min(processed, resident) for ``volume``, which the core scales by
  the replica's hit rate, the resident tokens for the other kinds);
- the per-replica and per-session rules the router core's own snapshot follows too are
  ``replica_view`` and ``session_view`` (``services.planner.core.model``);
- readiness: a held request (phase WAITING) is ready; otherwise the predictor's latest
  prediction decides (``services.router.core.readiness.is_ready``: fresh within 30 s, for
  the current tool call, flagged ready or returning within 1 s);
- tenant headroom: budget cap minus the tenant's requests in flight (router demand).
Records of a writer epoch other than that writer's live epoch are ignored.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from pydantic import Field

from services.common.convert import PHASE_FROM_PROTO, PHASE_TO_PROTO
from services.common.core.evidence import CacheEvidence
from services.common.epoch import Stamp
from services.common.errors import InvalidArgument
from services.common.records import (
    AllocationRecord,
    AssignmentRecord,
    PlanRecord,
    PredictionRecord,
    ReplicaRecord,
    SessionRecord,
    TenantDemandRecord,
)
from services.common.vocabulary import DEFAULT_BLOCK_SIZE
from services.planner.core.explain import Explanation
from services.planner.core.model import (
    Objective,
    Plan,
    ReplicaState,
    SessionState,
    Snapshot,
    SnapshotError,
    replica_view,
    session_view,
)
from services.router.core.readiness import PredictionView, is_current, is_ready
from tao.common.v1 import common_pb2
from tao.planner.v1 import planner_pb2


class PlannerPlanRecord(PlanRecord):
    """What the planner stores under ``keys.PLAN`` and publishes on ``keys.PLAN_CHANNEL``."""

    dp_states: int = Field(default=0, ge=0)
    pruned_pairs: int = Field(default=0, ge=0)
    unit_tokens: int = Field(default=0, ge=0)
    pool_sessions: int = Field(default=0, ge=0)




# ------------------------------------------------------------------------ proto <-> core


def snapshot_from_proto(msg: planner_pb2.Snapshot) -> Snapshot:
    """A validated core snapshot; ``InvalidArgument`` naming the bad field otherwise.

    As in the JSON form, an unset phase means WAITING and an unset credit kind ``cached_tokens``."""
    sessions = []
    for i, s in enumerate(msg.sessions):
        if s.phase != common_pb2.SESSION_PHASE_UNSPECIFIED and s.phase not in PHASE_FROM_PROTO:
            raise InvalidArgument(f"sessions[{i}].phase: unknown value {s.phase}")
        sessions.append(SessionState(
            id=s.id, tenant=s.tenant, footprint_tokens=s.footprint_tokens, ready=s.ready,
            credits=tuple(CacheEvidence.of_credit(c.replica, c.tokens, c.observed_at_s, c.kind or "cached_tokens")
                          for c in s.credits),
            phase=PHASE_FROM_PROTO.get(s.phase, "WAITING"), replica=s.replica or None, admitted=s.admitted,
            context_tokens=s.context_tokens,
            acting_since_s=s.acting_since_s if s.HasField("acting_since_s") else None,
            waiting_since_s=s.waiting_since_s if s.HasField("waiting_since_s") else None,
            tool_return_s=s.tool_return_s if s.HasField("tool_return_s") else None,
            model=s.model,
        ))
    snapshot = Snapshot(
        now_s=msg.now_s,
        replicas=tuple(ReplicaState(r.id, r.capacity_tokens, r.used_tokens, r.healthy, models=tuple(r.models),
                                    block_size=r.block_size or DEFAULT_BLOCK_SIZE) for r in msg.replicas),
        sessions=tuple(sessions),
        tenant_headroom=dict(msg.tenant_headroom) or None,
    )
    try:
        snapshot.validate()
    except SnapshotError as exc:
        raise InvalidArgument(f"bad snapshot: {exc}") from exc
    return snapshot


def snapshot_to_proto(snapshot: Snapshot) -> planner_pb2.Snapshot:
    return planner_pb2.Snapshot(
        now_s=snapshot.now_s,
        replicas=[planner_pb2.Replica(id=r.id, capacity_tokens=r.capacity_tokens, used_tokens=r.used_tokens,
                                      healthy=r.healthy, models=list(r.models), block_size=r.block_size)
                  for r in snapshot.replicas],
        sessions=[planner_pb2.Session(
            id=s.id, tenant=s.tenant, footprint_tokens=s.footprint_tokens, ready=s.ready,
            credits=[planner_pb2.Credit(replica=c.replica, tokens=c.credit_tokens, observed_at_s=c.observed_at_s,
                                        kind=c.kind) for c in s.credits],
            phase=PHASE_TO_PROTO[s.phase], replica=s.replica or "", admitted=s.admitted,
            context_tokens=s.context_tokens, acting_since_s=s.acting_since_s,
            waiting_since_s=s.waiting_since_s, tool_return_s=s.tool_return_s, model=s.model,
        ) for s in snapshot.sessions],
        tenant_headroom=dict(snapshot.tenant_headroom or {}),
    )


def _objective(value: Objective) -> common_pb2.Objective:
    return common_pb2.Objective(credit_tokens=value[0], ready_sessions=value[1], footprint_tokens=value[2])


def plan_to_proto(plan: Plan, stamp: Stamp | None = None, created_at_unix_s: float = 0.0) -> planner_pb2.Plan:
    """An unpublished plan (``stamp`` None: revision zero) or a published one."""
    msg = planner_pb2.Plan(
        revision=common_pb2.Revision(epoch=stamp.epoch if stamp else "", revision=stamp.rev if stamp else 0),
        assignments=[planner_pb2.Assignment(session=a.session, replica=a.replica) for a in plan.assignments],
        pauses=list(plan.pauses),
        objective=_objective(plan.objective),
        solver=plan.solver,
        solve_ms=plan.solve_ms,
        excluded_by_rounding=plan.excluded_by_rounding,
        policy=plan.policy,
        created_at_unix_s=created_at_unix_s,
    )
    if plan.upper_bound is not None:
        msg.upper_bound.CopyFrom(_objective(plan.upper_bound))
    return msg


def record_to_proto(rec: PlanRecord) -> planner_pb2.Plan:
    msg = planner_pb2.Plan(
        revision=common_pb2.Revision(epoch=rec.epoch, revision=rec.rev),
        assignments=[planner_pb2.Assignment(session=a.session, replica=a.replica) for a in rec.assignments],
        pauses=list(rec.pauses),
        objective=_objective(rec.objective),
        solver=rec.solver,
        solve_ms=rec.solve_ms,
        excluded_by_rounding=rec.excluded_by_rounding,
        policy=rec.policy,
        created_at_unix_s=rec.created_at_unix_s,
    )
    if rec.upper_bound is not None:
        msg.upper_bound.CopyFrom(_objective(rec.upper_bound))
    return msg


def plan_to_record(plan: Plan, stamp: Stamp, snapshot_at_unix_s: float, created_at_unix_s: float,
                   pool_sessions: int) -> PlannerPlanRecord:
    return PlannerPlanRecord(
        epoch=stamp.epoch, rev=stamp.rev, policy=plan.policy,
        assignments=tuple(AssignmentRecord(session=a.session, replica=a.replica) for a in plan.assignments),
        pauses=plan.pauses, objective=plan.objective, upper_bound=plan.upper_bound, solver=plan.solver,
        solve_ms=max(0.0, plan.solve_ms), excluded_by_rounding=plan.excluded_by_rounding,
        snapshot_at_unix_s=snapshot_at_unix_s, created_at_unix_s=created_at_unix_s,
        dp_states=plan.dp_states, pruned_pairs=plan.pruned_pairs, unit_tokens=plan.unit_tokens,
        pool_sessions=pool_sessions,
    )


def explanation_to_proto(exp: Explanation, stamp: Stamp) -> planner_pb2.ExplainSessionResponse:
    return planner_pb2.ExplainSessionResponse(
        session_id=exp.session, admitted=exp.admitted, replica=exp.replica or "", ready=exp.ready,
        footprint_tokens=exp.footprint_tokens, needed_units=exp.needed_units,
        values=[planner_pb2.ReplicaValue(replica=v.replica, credit_tokens=v.credit_tokens, free_tokens=v.free_tokens,
                                         eligible=v.eligible) for v in exp.values],
        reason=exp.reason, plan_revision=common_pb2.Revision(epoch=stamp.epoch, revision=stamp.rev),
    )


# ------------------------------------------------------------------------ records -> core


def snapshot_from_records(
    now_unix_s: float,
    sessions: Iterable[SessionRecord],
    replicas: Iterable[ReplicaRecord],
    predictions: Mapping[str, PredictionRecord],
    allocation: AllocationRecord | None = None,
    demand: Iterable[TenantDemandRecord] = (),
    horizon_s: float = 1.0,
    fresh_s: float = 30.0,
) -> Snapshot:
    """The planner's snapshot of the router's, predictor's and budget's published state
    (see the module docstring); every list sorted by id. Raises nothing on odd records: they
    are normalised so the snapshot always validates."""
    reps = sorted(replicas, key=lambda r: r.replica_id)
    known = {r.replica_id for r in reps}
    replica_states = tuple(
        replica_view(
            r.replica_id, r.capacity_tokens, r.used_tokens, eligible=r.healthy and not r.draining,
            running=r.running, waiting=r.waiting, prefix_hit_rate=r.prefix_hit_rate, models=r.models,
            block_size=r.block_size,
        )
        for r in reps
    )
    out = []
    for s in sorted(sessions, key=lambda s: s.session_id):
        if s.phase == "ENDED":
            continue
        footprint = s.footprint_tokens or (s.context_tokens + s.expected_append_tokens + int(s.ewma_output_tokens))
        ready = s.phase == "WAITING"
        pred = predictions.get(s.session_id)
        returns: float | None = None
        if not ready and pred is not None:
            view = PredictionView(pred.ready or pred.completed, pred.started_at_unix_s, pred.refreshed_at_unix_s,
                                  pred.predicted_return_unix_s, pred.deadline_unix_s)
            ready = is_ready(view, now_unix_s, s.acting_since_unix_s, horizon_s, fresh_s)
            if is_current(view, now_unix_s, s.acting_since_unix_s, fresh_s):
                returns = pred.predicted_return_unix_s
        out.append(session_view(
            s.session_id, s.tenant, known_replicas=known, footprint_tokens=footprint, ready=ready, evidence=s.cache,
            # a RUNNING session whose replica left the table is back in the pool, waiting
            phase="WAITING" if s.phase == "RUNNING" and not (s.admitted and s.replica in known) else s.phase,
            replica=s.replica, admitted=s.admitted, context_tokens=s.context_tokens,
            acting_since_s=s.acting_since_unix_s, waiting_since_s=s.waiting_since_unix_s, tool_return_s=returns,
            model=s.model,
        ))
    headroom = None
    if allocation is not None:
        in_flight = {d.tenant: d.in_flight for d in demand}
        headroom = {t: max(0, cap - in_flight.get(t, 0)) for t, cap in allocation.caps.items()}
    return Snapshot(now_s=now_unix_s, replicas=replica_states, sessions=tuple(out), tenant_headroom=headroom)
