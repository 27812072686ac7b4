"""A prefix that sessions share is reserved once per replica (``CoreConfig.share_prefixes_below_tokens``,
docs/algorithms.md#footprint): vLLM's prefix cache holds one copy of a common system prompt for
every session on the replica, so counting it once per session over-reserves the KV cache. ``tao``
does so on replicas whose decode step stays bound by the weights with the whole cache read."""

from __future__ import annotations

from services.planner.core.registry import make_policy
from services.router.core.model import CoreConfig, NewRequest, PlanDecision, Replica, Usage
from services.router.core.snapshot import build_snapshot
from services.router.core.state import RouterCore, policy_flags

SYSTEM = 4_000  # the shared system prompt's tokens


def core_with(share: bool, replicas: int = 1, kv: int = 100_000) -> RouterCore:
    core = RouterCore(CoreConfig(share_prefixes_below_tokens=100_000 if share else 0))
    for i in range(replicas):
        core.upsert_replica(Replica(f"r{i}", f"http://r{i}", kv_capacity_tokens=kv, healthy=True), 0.0)
    return core


def turn(core: RouterCore, sid: str, n: int, now: float, key: str = "agent", prompt: int = 10_000) -> str:
    rid = f"{sid}/{n}"
    core.arrive(now, NewRequest(rid, sid, "A", False, prompt, 500, prefix_key=key, prefix_tokens=SYSTEM))
    return rid


def admit(core: RouterCore, sid: str, replica: str, now: float) -> None:
    report = core.apply_plan(now, PlanDecision(((sid, replica),), (), now, "test"))
    assert report.admitted == ((sid, replica),), report


def test_two_sessions_of_one_prefix_hold_one_copy_on_their_replica() -> None:
    shared, alone = core_with(True), core_with(False)
    for core in (shared, alone):
        for i, sid in enumerate(("a", "b")):
            turn(core, sid, 0, float(i))
            admit(core, sid, "r0", float(i))
    full = alone.sessions["a"].footprint_tokens
    assert alone.used["r0"] == 2 * full  # each session counts the system prompt
    assert shared.sessions["a"].footprint_tokens == full - SYSTEM  # what each adds beside the copy
    assert shared.used["r0"] == 2 * (full - SYSTEM) + SYSTEM  # the copy once
    # a session of another prefix shares nothing with them
    turn(shared, "c", 0, 3.0, key="other")
    admit(shared, "c", "r0", 3.0)
    assert shared.used["r0"] == 3 * (full - SYSTEM) + 2 * SYSTEM


def test_the_last_session_of_a_prefix_takes_the_copy_along() -> None:
    core = core_with(True)
    for i, sid in enumerate(("a", "b")):
        turn(core, sid, 0, float(i))
        admit(core, sid, "r0", float(i))
    for sid in ("a", "b"):
        core.release(6.0, sid, force=True)
    assert core.used["r0"] == 0 and not core._prefix_held


def test_a_pool_session_counts_the_copy_until_every_replica_it_may_go_to_holds_it() -> None:
    core = core_with(True, replicas=2)
    turn(core, "a", 0, 0.0)
    full = core.sessions["a"].footprint_tokens
    assert full > SYSTEM
    admit(core, "a", "r0", 0.0)
    turn(core, "p", 0, 1.0)
    assert core.sessions["p"].footprint_tokens == full  # r1 holds no copy: it may have to bring one
    turn(core, "b", 0, 2.0)
    admit(core, "b", "r1", 2.0)
    assert core.sessions["p"].footprint_tokens == full - SYSTEM  # both hold it now
    snap = build_snapshot(core, 2.0, {})
    assert {s.id: s.footprint_tokens for s in snap.sessions}["p"] == full - SYSTEM
    core.release(3.0, "b", force=True)  # r1's only holder leaves: the pool session is re-priced
    assert core.sessions["p"].footprint_tokens == full


def test_a_finished_turn_keeps_the_copy_and_the_accounting_exact() -> None:
    core = core_with(True)
    turn(core, "a", 0, 0.0)
    turn(core, "b", 0, 0.0)
    admit(core, "a", "r0", 0.0)
    admit(core, "b", "r0", 0.0)
    for g in core.dispatch(0.0):
        core.finish(1.0, g.request_id, Usage(10_000, 400, SYSTEM))
    a, b = core.sessions["a"], core.sessions["b"]
    assert core.used["r0"] == a.footprint_tokens + b.footprint_tokens + SYSTEM
    assert a.shared_tokens == b.shared_tokens == SYSTEM


def test_a_replica_above_the_bound_counts_the_prefix_per_session() -> None:
    core = core_with(True, replicas=2)
    core.upsert_replica(Replica("r1", "http://r1", kv_capacity_tokens=200_000, healthy=True), 0.0)
    for i, sid in enumerate(("a", "b")):
        turn(core, sid, 0, float(i))
        admit(core, sid, "r1", float(i))
    full = core.sessions["a"].footprint_tokens
    assert core.sessions["a"].shared_tokens == 0 and core.used["r1"] == 2 * full
    turn(core, "c", 0, 2.0)
    admit(core, "c", "r0", 2.0)
    turn(core, "p", 0, 3.0)
    assert core.sessions["p"].footprint_tokens == full  # r1 may take it, and r1 does not share
    # r1's cache shrinks below the bound (a new scrape): its sessions' copies merge into one
    core.upsert_replica(Replica("r1", "http://r1", kv_capacity_tokens=50_000, healthy=True), 4.0)
    assert core.used["r1"] == 2 * (full - SYSTEM) + SYSTEM
    assert core.sessions["p"].footprint_tokens == full - SYSTEM


def test_tao_shares_below_its_weight_bound_and_the_baselines_never() -> None:
    tao = make_policy("tao")
    bound = policy_flags(tao)["share_prefixes_below_tokens"]
    # qwen3-32b-h100x2's decode fit: 14.44 ms of weights per step, 5.22e-8 s per KV token read
    assert bound == int(1.444e-2 / 5.22e-8) == 276_628
    assert policy_flags(make_policy("tao", engine_profile="qwen3-32b-h100x1"))["share_prefixes_below_tokens"] < bound
    for name in ("tao-per-session", "tao-paper", "thunderagent", "sjf", "continuum", "least_loaded"):
        assert policy_flags(make_policy(name))["share_prefixes_below_tokens"] == 0, name
