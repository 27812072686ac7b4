"""``explain_session``: the operator's answer to "why is my session waiting?" (pure core)."""

from __future__ import annotations

import json

from services.router.core.explain import PlanFacts, PredictionFacts, explain_session, session_row
from services.router.core.model import CoreConfig, NewRequest, PlanDecision, Replica, Usage
from services.router.core.state import RouterCore

PLAN = PlanFacts(source="planner rev 7", epoch="e1", revision=7, age_s=0.4, policy="tao", fallback="tao")


def make(kv: int = 10_000, **cfg: bool) -> RouterCore:
    core = RouterCore(CoreConfig(**cfg))
    for rid in ("r0", "r1"):
        core.upsert_replica(Replica(id=rid, url=f"http://{rid}", kv_capacity_tokens=kv, healthy=True), 0.0)
    return core


def run_one(core: RouterCore, sid: str, replica: str, now_s: float, prompt: int = 1000, out: int = 100,
            cached: int | None = 0) -> None:
    """Admit ``sid`` on ``replica`` and complete one request there."""
    g = core.arrive(now_s, NewRequest(f"{sid}-{now_s}", sid, "A", False, prompt, out))
    if g is None:
        core.apply_plan(now_s, PlanDecision(((sid, replica),), (), now_s, "planner rev 1"))
        (g,) = core.dispatch(now_s)
    core.finish(now_s + 1, g.request_id, Usage(prompt, out, cached))


def test_admitted_session_between_requests() -> None:
    core = make()
    core.arrive(0.0, NewRequest("q0", "s1", "A", False, 1000, 100))  # held: creates the session
    core.apply_plan(0.1, PlanDecision((("s1", "r1"),), (), 0.1, "planner rev 7"))
    (g,) = core.dispatch(0.1)
    core.finish(2.0, g.request_id, Usage(1000, 100, 0))
    pred = PredictionFacts("c1", "bash", False, "", "tool_history", 20.0, 15.0, 1002.0, 1004.0, 1022.0)
    ex = explain_session(core, "s1", 12.0, 1012.0, prediction=pred, plan=PLAN, acting_since_unix_s=1002.0)
    assert ex.phase == "ACTING" and ex.admitted and ex.replica == "r1"
    assert not ex.held and ex.constraint == "admitted"
    credit = {c.replica: c for c in ex.credits}
    assert credit["r1"].k0_tokens == 1100 and credit["r1"].evidence == "cached_tokens"
    assert credit["r1"].credit_tokens == 550  # 10 s later: half of k0
    assert credit["r0"].credit_tokens == 0 and credit["r0"].evidence is None
    assert not ex.readiness.ready and ex.readiness.source == "prediction" and ex.readiness.current
    assert ex.readiness.returns_in_s == 10.0
    text = ex.to_text()
    assert "not held: admitted on r1 (last plan applied: planner rev 7)" in text
    assert "bash expected to return in 10.0 s" in text
    assert "r1" in text and "k=550" in text
    body = json.loads(json.dumps(ex.to_json()))
    assert body["constraint"] == "admitted" and body["plan"]["revision"] == 7
    assert body["readiness"]["prediction"]["tool"] == "bash"


def test_held_session_that_fits_nowhere_names_the_replica_and_the_tokens_missing() -> None:
    core = make(kv=2000)  # admissible 1900 per replica
    run_one(core, "big", "r0", 0.0, prompt=1200, out=100)  # stays admitted on r0
    run_one(core, "other", "r1", 0.0, prompt=800, out=100)
    core.arrive(5.0, NewRequest("q1", "s2", "A", False, 1500, 100))  # footprint > free anywhere
    ex = explain_session(core, "s2", 6.0, 1006.0, plan=PLAN)
    assert ex.phase == "WAITING" and ex.held and ex.constraint == "capacity"
    assert ex.queue_position == 1 and ex.queue_length == 1 and ex.waiting_s == 1.0
    assert ex.pool_rank == 1 and ex.pool_size == 1
    assert ex.readiness.ready and ex.readiness.source == "held_request"
    free = {c.replica: c.free_tokens for c in ex.credits}
    roomiest = max(free, key=lambda r: free[r])
    assert f"the most free is {free[roomiest]} on {roomiest} (planner rev 7)" in ex.reason
    assert any(f"tokens freed on {roomiest}" in w for w in ex.admit_when)
    text = ex.to_text()
    assert text.startswith("session s2 (tenant A): WAITING")
    assert "HELD: fits nowhere" in text and "held queue: position 1 of 1" in text


def test_held_by_the_tenant_cap_says_cap_and_what_frees_a_slot() -> None:
    core = make()
    core.set_caps({"A": 1}, {"A": 1})
    run_one(core, "s1", "r0", 0.0)
    core.arrive(2.0, NewRequest("a", "s1", "A", False, 1200, 100))  # s1's next request: in flight
    core.arrive(2.5, NewRequest("b", "s2", "A", False, 500, 100))  # held: tenant A at its cap
    ex = explain_session(core, "s2", 3.0, 1003.0, plan=PLAN)
    assert ex.constraint == "tenant_cap" and ex.held
    assert ex.tenant_facts.cap == 1 and ex.tenant_facts.in_flight == 1 and not ex.tenant_facts.slot_free
    assert "tenant A is at its budget cap: 1 in flight, cap 1" in ex.reason
    assert any("request of tenant A ending" in w for w in ex.admit_when)


def test_held_session_that_fits_waits_for_the_plan_and_its_readiness() -> None:
    core = make()
    core.arrive(1.0, NewRequest("q", "s3", "A", False, 300, 50))
    ex = explain_session(core, "s3", 1.5, 1001.5, plan=PLAN)
    assert ex.constraint == "plan_order" and "planner rev 7 did not admit it" in ex.reason
    assert ex.admit_when and "next plan round" in ex.admit_when[0]
    silent = PlanFacts(source=None, planner_silent=True, fallback="tao", fallback_live=False, policy="tao")
    ex2 = explain_session(core, "s3", 1.5, 1001.5, plan=silent)
    assert ex2.constraint == "no_live_plan"
    assert "planner silent, local fallback tao admits" in ex2.to_text()


def test_paused_session_and_stale_prediction() -> None:
    core = make(pause_revalidation=False)
    run_one(core, "s4", "r0", 0.0)
    core.apply_plan(3.0, PlanDecision((), ("s4",), 3.0, "planner rev 9"))
    pred = PredictionFacts("c", "pytest", False, "", "default", 60.0, 50.0, 900.0, 900.0, 960.0)
    ex = explain_session(core, "s4", 4.0, 1004.0, prediction=pred, plan=PLAN, acting_since_unix_s=1001.0)
    assert ex.phase == "PAUSED" and ex.held and ex.constraint == "paused"
    core.arrive(5.0, NewRequest("w", "s5", "A", False, 100, 10))  # a held request ranks first in the pool
    ex = explain_session(core, "s4", 5.0, 1005.0, prediction=pred, plan=PLAN, acting_since_unix_s=1001.0)
    assert (ex.pool_rank, ex.pool_size) == (2, 2) and "pool order: 2 of 2" in ex.to_text()
    assert "paused by plan (planner rev 9)" in ex.reason
    assert ex.readiness.source == "prediction_stale" and not ex.readiness.ready
    assert "its tool returning" in ex.admit_when[0]


def test_session_row() -> None:
    core = make()
    core.arrive(1.0, NewRequest("q", "s5", "B", False, 300, 50))
    row = session_row(core, "s5", 3.0)
    assert row["phase"] == "WAITING" and row["tenant"] == "B" and row["waiting_s"] == 2.0 and row["held"] == 1
