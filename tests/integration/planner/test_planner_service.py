"""The planner service over real gRPC and a real Redis: rounds publish plans with increasing
revisions, pool changes trigger rounds, SolveSnapshot validates and publishes nothing,
ExplainSession answers from the last plan, stale-epoch records are ignored."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest
import redis.asyncio as aioredis

from services.common import keys
from services.common.core.evidence import CacheEvidence
from services.common.records import PredictionRecord, ReplicaRecord, SessionRecord, load
from services.common.settings import load_settings
from services.common.testing import RedisServer, serve_in_process
from services.planner.convert import PlannerPlanRecord
from services.planner.server import PlannerApp
from services.planner.settings import Settings
from tao.common.v1 import common_pb2
from tao.planner.v1 import planner_pb2, planner_pb2_grpc

ROUTER_EPOCH = "router-epoch-1"


def _settings(redis_url: str, **kw: object) -> Settings:
    return load_settings(Settings, redis_url=redis_url, port=0, redis_startup_timeout_s=2.0, **kw)


async def _write_state(r: aioredis.Redis, epoch: str = ROUTER_EPOCH) -> None:
    now = time.time()
    await r.set(keys.epoch_key("router"), ROUTER_EPOCH)
    replicas = [ReplicaRecord(epoch=epoch, rev=1, replica_id=rid, url=f"http://{rid}", healthy=True,
                              kv_capacity_tokens=10_000, capacity_tokens=9_500, used_tokens=used,
                              updated_at_unix_s=now) for rid, used in (("r0", 9_000), ("r1", 1_500))]
    hot = CacheEvidence(replica="r0", resident_tokens=3_000, prompt_tokens=2_800, cached_tokens=2_000,
                           processed_tokens=3_000, observed_at_s=now - 1, kind="cached_tokens")
    warm = CacheEvidence(replica="r1", resident_tokens=2_000, prompt_tokens=1_900, cached_tokens=1_000,
                            processed_tokens=2_000, observed_at_s=now - 1, kind="cached_tokens")
    sessions = [
        SessionRecord(epoch=epoch, rev=1, session_id="held", tenant="a", phase="WAITING", footprint_tokens=3_000,
                      cache=(warm,), created_at_unix_s=now, updated_at_unix_s=now, waiting_since_unix_s=now),
        SessionRecord(epoch=epoch, rev=1, session_id="paused", tenant="a", phase="PAUSED", footprint_tokens=4_000,
                      cache=(hot,), created_at_unix_s=now, updated_at_unix_s=now),
        SessionRecord(epoch=epoch, rev=1, session_id="huge", tenant="b", phase="WAITING", footprint_tokens=50_000,
                      created_at_unix_s=now, updated_at_unix_s=now, waiting_since_unix_s=now),
    ]
    await r.hset(keys.REPLICAS, mapping={x.replica_id: x.model_dump_json() for x in replicas})
    await r.hset(keys.SESSIONS, mapping={x.session_id: x.model_dump_json() for x in sessions})


async def test_rounds_publish_plans_with_increasing_revisions(redis_url: str, redis_client: aioredis.Redis) -> None:
    await _write_state(redis_client)
    app = PlannerApp(_settings(redis_url), autorun=False)
    async with serve_in_process("planner", app, _settings(redis_url)) as running:
        assert app.service is not None
        async with grpc.aio.insecure_channel(running.address) as channel:
            stub = planner_pb2_grpc.PlannerServiceStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.GetPlan(planner_pb2.GetPlanRequest(), timeout=5)
            assert err.value.code() == grpc.StatusCode.NOT_FOUND
            first = await app.service.plan_once()
            second = await app.service.plan_once()
            assert first is not None and second is not None
            assert (first.rev, second.rev) == (1, 2) and first.epoch == second.epoch == app.service.epoch
            # r0 has 500 free, r1 8,000: both 3,000 + 4,000 fit on r1 (credit only for "held");
            # "huge" fits nowhere.
            assert {(a.session, a.replica) for a in second.assignments} == {("held", "r1"), ("paused", "r1")}
            got = await stub.GetPlan(planner_pb2.GetPlanRequest(), timeout=5)
            assert got.plan.revision == common_pb2.Revision(epoch=app.service.epoch, revision=2)
            assert got.plan.solver == "exact-dp" and got.plan.policy == "tao"
            assert got.plan.objective.ready_sessions == 1 and got.plan.objective.credit_tokens > 0
        stored = load(PlannerPlanRecord, await redis_client.get(keys.PLAN))
        assert stored.rev == 2 and stored.epoch == await redis_client.get(keys.epoch_key("planner"))
        assert stored.pool_sessions == 3 and stored.snapshot_at_unix_s <= stored.created_at_unix_s


async def test_pool_changes_trigger_rounds_and_watchers_see_them(redis_url: str, redis_client: aioredis.Redis) -> None:
    await _write_state(redis_client)
    settings = _settings(redis_url, tick_s=3600.0, debounce_s=0.01)
    app = PlannerApp(settings)
    async with serve_in_process("planner", app, settings) as running:
        async with grpc.aio.insecure_channel(running.address) as channel:
            stub = planner_pb2_grpc.PlannerServiceStub(channel)
            for _ in range(100):  # the subscription's first kick plans once
                if app.service is not None and app.service.last is not None:
                    break
                await asyncio.sleep(0.05)
            assert app.service is not None and app.service.last is not None
            stream = stub.WatchPlans(planner_pb2.WatchPlansRequest(include_current=True), timeout=10)
            current = await stream.read()
            start = current.plan.revision.revision
            await redis_client.publish(keys.POOL_CHANNEL, "held")
            nxt = await asyncio.wait_for(stream.read(), 5)
            assert nxt.plan.revision.revision > start
            stream.cancel()


async def test_solve_snapshot_validates_and_publishes_nothing(redis_url: str, redis_client: aioredis.Redis) -> None:
    app = PlannerApp(_settings(redis_url), autorun=False)
    async with serve_in_process("planner", app, _settings(redis_url)) as running:
        async with grpc.aio.insecure_channel(running.address) as channel:
            stub = planner_pb2_grpc.PlannerServiceStub(channel)
            snapshot = planner_pb2.Snapshot(
                now_s=100.0,
                replicas=[planner_pb2.Replica(id="r0", capacity_tokens=100, used_tokens=0, healthy=True)],
                sessions=[planner_pb2.Session(id="s", tenant="t", footprint_tokens=40, ready=True,
                                              credits=[planner_pb2.Credit(replica="r0", tokens=30, observed_at_s=100.0)])],
            )
            ok = await stub.SolveSnapshot(planner_pb2.SolveSnapshotRequest(snapshot=snapshot), timeout=5)
            assert ok.plan.revision.revision == 0
            assert [(a.session, a.replica) for a in ok.plan.assignments] == [("s", "r0")]
            obj = ok.plan.objective
            assert (obj.credit_tokens, obj.ready_sessions, obj.footprint_tokens) == (30, 1, 40)
            bad = planner_pb2.Snapshot()
            bad.CopyFrom(snapshot)
            bad.replicas.append(planner_pb2.Replica(id="r0", capacity_tokens=5))
            for request, needle in (
                (planner_pb2.SolveSnapshotRequest(snapshot=bad), "duplicate replica id 'r0'"),
                (planner_pb2.SolveSnapshotRequest(snapshot=snapshot, policy="nope"), "unknown policy 'nope'"),
            ):
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await stub.SolveSnapshot(request, timeout=5)
                assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert needle in (err.value.details() or "")
            neg = planner_pb2.Snapshot()
            neg.CopyFrom(snapshot)
            neg.replicas[0].used_tokens = -5
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.SolveSnapshot(planner_pb2.SolveSnapshotRequest(snapshot=neg), timeout=5)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "replicas[0].used_tokens" in (err.value.details() or "")
    assert await redis_client.get(keys.PLAN) is None
    assert app.service is not None and app.service.last is None


async def test_explain_session_from_the_last_plan(redis_url: str, redis_client: aioredis.Redis) -> None:
    await _write_state(redis_client)
    app = PlannerApp(_settings(redis_url), autorun=False)
    async with serve_in_process("planner", app, _settings(redis_url)) as running:
        assert app.service is not None
        async with grpc.aio.insecure_channel(running.address) as channel:
            stub = planner_pb2_grpc.PlannerServiceStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.ExplainSession(planner_pb2.ExplainSessionRequest(session_id="held"), timeout=5)
            assert err.value.code() == grpc.StatusCode.NOT_FOUND
            await app.service.plan_once()
            held = await stub.ExplainSession(planner_pb2.ExplainSessionRequest(session_id="held"), timeout=5)
            assert held.admitted and held.replica == "r1" and held.plan_revision.revision == 1
            huge = await stub.ExplainSession(planner_pb2.ExplainSessionRequest(session_id="huge"), timeout=5)
            assert not huge.admitted and "fits nowhere: needs 50000 tokens" in huge.reason
            assert [v.replica for v in huge.values] == ["r0", "r1"] and not any(v.eligible for v in huge.values)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.ExplainSession(planner_pb2.ExplainSessionRequest(session_id="ghost"), timeout=5)
            assert err.value.code() == grpc.StatusCode.NOT_FOUND


async def test_stale_epochs_and_bad_records_are_skipped(redis_url: str, redis_client: aioredis.Redis) -> None:
    await _write_state(redis_client, epoch="an-old-router")  # a previous router process wrote these
    await redis_client.hset(keys.SESSIONS, "garbage", "{not json")
    now = time.time()
    await redis_client.set(keys.epoch_key("predictor"), "p1")
    pred = PredictionRecord(epoch="p1", rev=1, session_id="paused", call_id="c", tool="sleep", ready=True,
                            ready_reason="completed", expected_duration_s=1.0, remaining_s=0.0, elapsed_s=1.0,
                            evidence="completed", completed=True, started_at_unix_s=now - 2,
                            refreshed_at_unix_s=now, predicted_return_unix_s=now)
    await redis_client.hset(keys.PREDICTIONS, "paused", pred.model_dump_json())
    app = PlannerApp(_settings(redis_url), autorun=False)
    async with serve_in_process("planner", app, _settings(redis_url)):
        assert app.service is not None
        rec = await app.service.plan_once()
        assert rec is not None and rec.pool_sessions == 0 and rec.assignments == ()
        await _write_state(redis_client)  # the live router republishes
        rec = await app.service.plan_once()
        assert rec is not None and rec.pool_sessions == 3
        assert app.service.last is not None
        ready = {s.id: s.ready for s in app.service.last.snapshot.sessions}
        assert ready == {"held": True, "paused": True, "huge": True}


async def test_a_redis_outage_skips_rounds_and_planning_resumes(redis_proc: RedisServer) -> None:
    app = PlannerApp(_settings(redis_proc.url), autorun=False)
    async with serve_in_process("planner", app, _settings(redis_proc.url)):
        assert app.service is not None
        assert await app.service.plan_once() is not None
        redis_proc.kill()
        assert await app.service.plan_once() is None  # nothing read, nothing published
        redis_proc.start()  # comes back empty (no persistence)
        client = aioredis.Redis.from_url(redis_proc.url, decode_responses=True)
        try:
            await _write_state(client)
            rec = None
            for _ in range(50):
                rec = await app.service.plan_once()
                if rec is not None:
                    break
                await asyncio.sleep(0.1)
            assert rec is not None and rec.rev == 2 and rec.pool_sessions == 3
            assert load(PlannerPlanRecord, await client.get(keys.PLAN)).rev == 2
        finally:
            await client.aclose()
