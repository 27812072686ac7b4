"""Why a session is (not) admitted by a plan: its value triple per replica, what it needed,
and what the plan admitted instead (the ``ExplainSession`` RPC and ``tao planner solve --explain``).

The explanation is recomputed from the snapshot the plan was made for, with the same value
rules (``ValueConfig``), so it states exactly the numbers the policy compared.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.planner.core.model import Plan, Snapshot
from services.planner.core.policy import CANDIDATE_PHASES, sorted_replicas
from services.planner.core.values import FULL_VALUES, ValueConfig, credit_matrix


@dataclass(frozen=True, slots=True)
class ReplicaValue:
    replica: str
    credit_tokens: int  # decayed k(s, n)
    free_tokens: int  # admissible before this plan's admissions (after its pauses)
    eligible: bool  # healthy, serves the session's model and the footprint fits the free tokens


@dataclass(frozen=True, slots=True)
class Explanation:
    session: str
    admitted: bool
    replica: str | None
    ready: bool
    footprint_tokens: int
    needed_units: int  # ceil(f / u) for the plan's unit (f when no DP ran)
    values: tuple[ReplicaValue, ...]
    reason: str


def explain(snapshot: Snapshot, plan: Plan, session_id: str, values: ValueConfig = FULL_VALUES) -> Explanation:
    """Explain ``session_id`` in ``plan``; ``KeyError`` when the snapshot has no such session."""
    by_id = {s.id: s for s in snapshot.sessions}
    ses = by_id[session_id]
    replicas = sorted_replicas(snapshot)
    freed: dict[str, int] = {}
    paused = set(plan.pauses)
    for s in snapshot.sessions:
        if s.id in paused and s.admitted and s.phase == "ACTING" and s.replica is not None:
            freed[s.replica] = freed.get(s.replica, 0) + s.footprint_tokens
    credit = credit_matrix(snapshot.now_s, [ses], replicas, values.half_life_s)[0]
    rows = []
    for j, r in enumerate(replicas):
        free = max(0, r.capacity_tokens - r.used_tokens + freed.get(r.id, 0)) if r.healthy else 0
        rows.append(ReplicaValue(r.id, int(credit[j]), free,
                                 r.healthy and r.serves(ses) and ses.footprint_tokens <= free))
    unit = plan.unit_tokens
    needed = -(-ses.footprint_tokens // unit) if unit > 0 else ses.footprint_tokens
    placed = {a.session: a.replica for a in plan.assignments}
    ready = ses.ready and values.use_readiness

    def triple(sid: str, rid: str) -> str:
        other = by_id[sid]
        k = int(credit_matrix(snapshot.now_s, [other], replicas, values.half_life_s)[0][
            [r.id for r in replicas].index(rid)])
        return f"{sid} (k={k}, r={int(other.ready and values.use_readiness)}, f={other.footprint_tokens})"

    admitted = ses.admitted and ses.id not in paused or ses.id in placed
    replica = placed.get(ses.id, ses.replica if ses.admitted else None)
    mine = f"k={max((v.credit_tokens for v in rows), default=0)}, r={int(ready)}, f={ses.footprint_tokens}"
    if ses.id in placed:
        here = next(v for v in rows if v.replica == placed[ses.id])
        reason = f"admitted on {placed[ses.id]} (k={here.credit_tokens}, r={int(ready)}, f={ses.footprint_tokens})"
    elif ses.admitted and ses.id in paused:
        when = "when its request ends" if ses.phase in ("RUNNING", "WAITING") else "now"
        reason = (f"paused {when}: {ses.replica} is over capacity and this session is among the lowest-value "
                  f"admitted ones there ({mine})")
    elif ses.admitted:
        reason = f"already admitted on {ses.replica}; not in the pool"
    elif ses.phase not in CANDIDATE_PHASES:
        reason = f"not a candidate: phase {ses.phase}"
    elif not any(r.healthy for r in replicas):
        reason = "no healthy replica"
    elif not any(r.healthy and r.serves(ses) for r in replicas):
        reason = f"no healthy replica serves model {ses.model!r}"
    elif not any(v.eligible for v in rows):
        serving = {r.id for r in replicas if r.serves(ses)}
        best = max((v for v in rows if v.replica in serving), key=lambda v: (v.free_tokens, v.replica))
        reason = (f"fits nowhere: needs {ses.footprint_tokens} tokens, the most free is {best.free_tokens} "
                  f"on {best.replica}")
    elif snapshot.tenant_headroom and snapshot.tenant_headroom.get(ses.tenant, 1) <= 0:
        reason = f"tenant {ses.tenant} has no headroom left"
    else:
        target = max((v for v in rows if v.eligible), key=lambda v: (v.credit_tokens, v.free_tokens, v.replica))
        rivals = [a.session for a in plan.assignments if a.replica == target.replica]
        used = sum(by_id[s].footprint_tokens for s in rivals)
        won = ", ".join(triple(s, target.replica) for s in rivals[:5]) or "nothing"
        more = f" and {len(rivals) - 5} more" if len(rivals) > 5 else ""
        reason = (f"not admitted ({mine}): on {target.replica}, its best replica ({target.free_tokens} free tokens), "
                  f"the plan admitted {won}{more} ({used} tokens), leaving {target.free_tokens - used}; "
                  f"the lexicographic objective (credit, ready, footprint) preferred them"
                  + (f"; it needed {needed} units of {unit} tokens" if unit > 1 else ""))
    return Explanation(
        session=ses.id,
        admitted=admitted,
        replica=replica if admitted else None,
        ready=ready,
        footprint_tokens=ses.footprint_tokens,
        needed_units=needed,
        values=tuple(rows),
        reason=reason,
    )
