"""Control-plane faults: Redis killed and restarted empty, each service killed -9 and
restarted, the planner frozen by SIGSTOP (docs/architecture.md#epoch-and-revision-fencing and
docs/architecture.md#failure-modes-and-degraded-behaviour)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import grpc

from bench.faults.env import FaultEnv
from bench.faults.outcome import (
    ScenarioResult,
    account,
    all_serving,
    load_for,
    ok_between,
    router_health,
    until,
)
from bench.faults.workload import running
from services.common import keys
from tao.budget.v1 import budget_pb2, budget_pb2_grpc
from tao.predictor.v1 import predictor_pb2, predictor_pb2_grpc

# ---------------------------------------------------------------------------- Redis wipe


async def redis_wipe(env: FaultEnv) -> ScenarioResult:
    """kill -9 Redis mid-workload, restart it empty; services recover and republish; a plan
    from before the wipe is never applied; nothing lost or duplicated."""
    res = ScenarioResult("redis_wipe")
    started = time.monotonic()
    r = env.redis()
    load = load_for(env, "wipe")
    async with running(load):
        await asyncio.sleep(1.5)
        pre_raw = r.get(keys.PLAN)
        res.check("a plan was published before the wipe", pre_raw is not None)
        pre: dict[str, Any] = json.loads(pre_raw) if pre_raw else {"epoch": "", "rev": 0}
        env.kill("redis")
        res.faults += 1
        down = time.monotonic()
        await asyncio.sleep(1.0)
        ok, n = ok_between(load.result, down, time.monotonic())
        res.check("router served while Redis was down", n > 0 and ok == n, f"{ok}/{n} ok")
        env.restart("redis")
        r = env.redis()
        if pre_raw:  # a delayed publish of the pre-wipe plan, before the planner republished
            r.set(keys.PLAN, pre_raw)
            r.publish(keys.PLAN_CHANNEL, pre_raw)
        await all_serving(env, res, "after the wipe")
        wanted = {keys.epoch_key("router"), keys.REPLICAS, keys.SESSIONS, keys.DEMAND, keys.epoch_key("planner"),
                  keys.PLAN, keys.epoch_key("budget"), keys.ALLOCATION, keys.BUDGET_CONFIG}

        async def republished() -> bool:
            return all(r.exists(k) for k in wanted) and r.get(keys.epoch_key("planner")) == pre["epoch"] \
                and json.loads(r.get(keys.PLAN) or "{}").get("rev", 0) > pre["rev"]

        ok_rep = await until(republished, 10)
        res.check("state republished (router, planner, budget)", ok_rep,
                  sorted(k for k in wanted if not r.exists(k)))
        alloc = json.loads(r.get(keys.ALLOCATION) or "{}")
        res.check("allocation republished with the configured total", alloc.get("total") == env.config.total_budget,
                  alloc.get("total"))
        async def caught_up() -> bool:  # the router has applied a plan published after the wipe
            got = await env.any_applied_plan()
            return got is not None and got[1] > pre["rev"]

        await until(caught_up, 10)
        before = await env.any_applied_plan()
        if pre_raw:  # and again once everything is back
            r.set(keys.PLAN, pre_raw)
            r.publish(keys.PLAN_CHANNEL, pre_raw)
        await asyncio.sleep(0.6)
        after = await env.any_applied_plan()
        res.check("router never applied the pre-wipe plan",
                  after is not None and after != (pre["epoch"], pre["rev"]) and before is not None
                  and after[1] >= before[1] > pre["rev"], f"pre-wipe {pre['rev']}, applied {before} -> {after}")
        back = time.monotonic()
        await asyncio.sleep(1.5)
        ok, n = ok_between(load.result, back, time.monotonic())
        res.check("requests succeed after recovery", n > 0 and ok == n, f"{ok}/{n} ok")
    account(env, res, load.result)
    res.check("every request finally answered ok", load.result.final("ok") == len(load.result.requests),
              load.result.summary())
    res.wall_s = time.monotonic() - started
    return res


# ---------------------------------------------------------------------------- service kills


async def kill_planner(env: FaultEnv) -> ScenarioResult:
    """kill -9 the planner: admitted sessions keep being served, new sessions are admitted by
    the router's fallback; after the restart the new planner's plans are applied and a plan
    of the dead planner's epoch is rejected whatever its revision."""
    res = ScenarioResult("kill_planner")
    started = time.monotonic()
    r = env.redis()
    # Sessions long enough to span the kill: with the default 4 turns every agent could be on
    # its last turn at the kill and no pre-kill session would have a request left (a CI run saw it).
    load = load_for(env, "kplan", turns=12)
    async with running(load):
        await asyncio.sleep(1.5)
        old_raw = r.get(keys.PLAN)
        old = json.loads(old_raw or "{}")
        env.kill("planner")
        res.faults += 1
        killed = time.monotonic()
        silent = await until(lambda: _planner_silent(env), 5)
        res.check("router notices the silent planner (fallback on)", silent)
        await asyncio.sleep(1.5)
        ok, n = ok_between(load.result, killed, time.monotonic())
        res.check("requests served while the planner is down", n > 0 and ok == n, f"{ok}/{n} ok")
        seen = load.result.first_seen()
        new_sessions = {s for s, t in seen.items() if t > killed + 0.3}
        new_ok = {a.session for a in load.result.attempts if a.session in new_sessions and a.kind == "ok"}
        res.check("new sessions admitted by the fallback", len(new_ok) > 0, f"{len(new_ok)}/{len(new_sessions)}")
        old_sessions = {s for s, t in seen.items() if t < killed}
        kept = {a.session for a in load.result.between(killed, time.monotonic()) if a.session in old_sessions
                and a.kind == "ok"}
        res.check("sessions admitted before the kill kept being served", len(kept) > 0, len(kept))
        env.restart("planner")
        fresh = await until(lambda: _new_epoch_applied(env, old.get("epoch", "")), 10)
        res.check("the restarted planner's plans are applied", fresh)
        if old_raw:
            forged = dict(old, rev=10**9, created_at_unix_s=time.time() * env.config.time_scale)
            body = json.dumps(forged)
            r.set(keys.PLAN, body)
            r.publish(keys.PLAN_CHANNEL, body)
            await asyncio.sleep(0.6)
            applied = await env.any_applied_plan()
            res.check("a plan of the dead planner's epoch is rejected", applied is not None and
                      applied[0] != old.get("epoch"), applied)
        await asyncio.sleep(1.0)
    await all_serving(env, res, "after the planner restart")
    account(env, res, load.result)
    res.check("every request finally answered ok", load.result.final("ok") == len(load.result.requests),
              load.result.summary())
    res.wall_s = time.monotonic() - started
    return res


async def _planner_silent(env: FaultEnv) -> bool:
    return bool((await router_health(env)).get("planner_silent"))


async def _new_epoch_applied(env: FaultEnv, old_epoch: str) -> bool:
    applied = await env.any_applied_plan()
    return applied is not None and applied[0] != old_epoch


async def _allocation(env: FaultEnv) -> budget_pb2.Allocation:
    async with grpc.aio.insecure_channel(env.addr.budget) as ch:
        reply = await budget_pb2_grpc.BudgetServiceStub(ch).GetAllocation(budget_pb2.GetAllocationRequest(),
                                                                           timeout=3)
    return reply.allocation


async def kill_budget(env: FaultEnv) -> ScenarioResult:
    """kill -9 the budget service while tenants are at their caps: the router keeps the last
    caps (in-flight requests at the replicas never exceed them); the restarted service
    resumes the stored configuration."""
    res = ScenarioResult("kill_budget")
    started = time.monotonic()
    cap_total = env.config.total_budget
    load = load_for(env, "kbud", agents=cap_total + 4, tool_s=0.02)
    async with running(load):
        await asyncio.sleep(1.5)
        before = await _allocation(env)
        res.check("caps published before the kill", sum(before.caps.values()) == cap_total, dict(before.caps))
        env.kill("budget")
        res.faults += 1
        killed = time.monotonic()
        env.tap_log.reset_peak()
        await asyncio.sleep(2.5)
        peak = env.tap_log.peak_active
        res.check("last caps hold while the budget service is down", 0 < peak <= cap_total,
                  f"peak in flight at replicas {peak}, cap {cap_total}")
        res.notes.append(f"peak in flight while down: {peak} (cap {cap_total}, {cap_total + 4} agents)")
        ok, n = ok_between(load.result, killed, time.monotonic())
        res.check("requests served while the budget service is down", n > 0 and ok == n, f"{ok}/{n} ok")
        env.restart("budget")
        after = await _allocation(env)
        res.check("restarted service resumes the stored configuration",
                  after.total == cap_total and dict(after.caps) == dict(before.caps), dict(after.caps))
        res.check("restarted service has a new epoch", after.revision.epoch != before.revision.epoch)
        env.tap_log.reset_peak()
        await asyncio.sleep(1.0)
        res.check("caps hold after the restart", env.tap_log.peak_active <= cap_total, env.tap_log.peak_active)
    await all_serving(env, res, "after the budget restart")
    account(env, res, load.result)
    res.check("every request finally answered ok", load.result.final("ok") == len(load.result.requests),
              load.result.summary())
    res.wall_s = time.monotonic() - started
    return res


async def _prediction_call(env: FaultEnv, session: str) -> str | None:
    async with grpc.aio.insecure_channel(env.addr.predictor) as ch:
        try:
            reply = await predictor_pb2_grpc.PredictorServiceStub(ch).GetPrediction(
                predictor_pb2.GetPredictionRequest(session_id=session), timeout=3)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                return None
            raise
    return reply.prediction.call_id


async def kill_predictor(env: FaultEnv) -> ScenarioResult:
    """kill -9 the predictor while tool runners report to it: requests are still admitted
    (readiness from observed completions), the runners' buffered events are delivered after
    the restart, and no event acknowledged before the kill is lost."""
    from services.driver.reporter_adapter import ReporterToolEvents

    res = ScenarioResult("kill_predictor")
    started = time.monotonic()
    tools = ReporterToolEvents(env.addr.predictor, time_scale=env.config.time_scale)
    reporter = tools._reporter
    load = load_for(env, "kpred")
    load.tools = tools
    try:
        async with running(load):
            await asyncio.sleep(1.5)
            flushed_at = time.monotonic()
            res.check("tool events acknowledged before the kill", await reporter.flush(3.0), reporter.stats)
            acked: dict[str, int] = {}
            for session, turn, t in load.result.tools_finished:
                if t < flushed_at:
                    acked[session] = max(turn, acked.get(session, -1))
            env.kill("predictor")
            res.faults += 1
            killed = time.monotonic()
            await asyncio.sleep(2.0)
            ok, n = ok_between(load.result, killed, time.monotonic())
            res.check("requests admitted while the predictor is down", n > 0 and ok == n, f"{ok}/{n} ok")
            env.restart("predictor")
            lost_events = []
            for session, turn in sorted(acked.items())[-20:]:
                call = await _prediction_call(env, session)
                got = int(call.rsplit(":", 1)[1]) if call and ":" in call else -1
                if got < turn:
                    lost_events.append(f"{session}: acked call {turn}, predictor knows {call}")
            res.check("no acknowledged tool event lost across the restart", acked and not lost_events,
                      lost_events[:3] or f"{len(acked)} sessions checked")
            await asyncio.sleep(1.0)
        # The reporter retries with backoff up to backoff_max_s: one full backoff may still be
        # running when the predictor is back, so give it that much on top of a delivery window.
        res.check("buffered events delivered after the restart",
                  await reporter.flush(reporter.backoff_max_s + 5.0), f"pending {reporter.pending}")
        res.check("no event dropped by the reporter", reporter.stats.dropped == 0, reporter.stats.dropped)
    finally:
        await tools.close()
    await all_serving(env, res, "after the predictor restart")
    account(env, res, load.result)
    res.check("every request finally answered ok", load.result.final("ok") == len(load.result.requests),
              load.result.summary())
    res.wall_s = time.monotonic() - started
    return res


async def kill_router(env: FaultEnv) -> ScenarioResult:
    """kill -9 the router: clients see their connections cut only while it is down and
    retry; the restarted router reads back the sessions and their admissions from Redis."""
    res = ScenarioResult("kill_router")
    started = time.monotonic()
    load = load_for(env, "krout")
    async with running(load):
        await asyncio.sleep(1.5)
        await asyncio.sleep(0.2)  # let the write-behind flush
        before = {s.session_id: (s.admitted, s.replica) for s in await env.sessions()}
        env.kill("router")
        res.faults += 1
        await asyncio.sleep(0.5)
        env.restart("router")
        after = {s.session_id: (s.admitted, s.replica) for s in await env.sessions()}
        common = set(before) & set(after)
        res.check("sessions restored from Redis", before and len(common) >= len(before) // 2,
                  f"{len(common)} of {len(before)} restored")
        moved = [s for s in common if before[s][0] and after[s][0] and before[s][1] != after[s][1]]
        res.check("restored admissions keep their replica", not moved, moved[:3])
        back = time.monotonic()
        await asyncio.sleep(1.5)
        ok, n = ok_between(load.result, back, time.monotonic())
        res.check("requests succeed after the restart", n > 0 and ok == n, f"{ok}/{n} ok")
    cut = load.result.count("cut")
    res.notes.append(f"{cut} attempts cut by the router kill, retried by clients")
    account(env, res, load.result)
    res.check("every request finally answered ok", load.result.final("ok") == len(load.result.requests),
              load.result.summary())
    res.wall_s = time.monotonic() - started
    return res


# ---------------------------------------------------------------------------- planner frozen


async def stop_planner(env: FaultEnv, stop_s: float = 10.0) -> ScenarioResult:
    """SIGSTOP the planner for ``stop_s``: the fallback admits meanwhile; then the planner's
    stale plan (made from a snapshot taken when it froze, published with the next revision,
    as a planner frozen mid-round would) reaches the router: revalidation rejects every part
    of it that the live state contradicts (sessions placed after that snapshot are neither
    moved nor paused); after SIGCONT the planner's plans are applied again."""
    res = ScenarioResult("stop_planner")
    started = time.monotonic()
    r = env.redis()
    scale = env.config.time_scale
    load = load_for(env, "stop")
    async with running(load):
        await asyncio.sleep(1.5)
        frozen_unix = time.time()
        env.freeze("planner")
        res.faults += 1
        frozen = time.monotonic()
        stamp = ("", 0)
        try:
            await asyncio.sleep(stop_s)
            ok, n = ok_between(load.result, frozen, time.monotonic())
            res.check("requests served while the planner is frozen", n > 0 and ok == n, f"{ok}/{n} ok")
            last = json.loads(r.get(keys.PLAN) or "{}")
            seen = load.result.first_seen()
            live = await env.sessions()
            replicas = sorted({rep.id for rep in await env.replicas()})
            targets = {s.session_id: s.replica for s in live
                       if s.admitted and seen.get(s.session_id, 0) > frozen + 0.2}
            res.check("the fallback admitted new sessions meanwhile", len(targets) > 0, len(targets))
            stale = dict(last, rev=int(last.get("rev", 0)) + 1,
                         assignments=[{"session": sid, "replica": next(x for x in replicas if x != rep)}
                                      for sid, rep in targets.items()],
                         pauses=list(targets), snapshot_at_unix_s=frozen_unix * scale,
                         created_at_unix_s=time.time() * scale)
            body = json.dumps(stale)
            r.set(keys.PLAN, body)
            r.publish(keys.PLAN_CHANNEL, body)
            stamp = (stale["epoch"], stale["rev"])
            reached = await until(lambda: _applied_is(env, stamp), 3, 0.05)
            res.check("the stale plan passed the epoch/revision fence", reached, stamp)
            now = {s.session_id: (s.admitted, s.replica) for s in await env.sessions()}
            changed = [f"{sid}: {rep} -> {now[sid]}" for sid, rep in targets.items()
                       if sid in now and now[sid] != (True, rep)]
            res.check("revalidation rejected the stale plan's moves and pauses", not changed, changed[:3])
        finally:
            env.thaw("planner")
        thawed = await until(lambda: _applied_newer(env, stamp), 10)
        res.check("after SIGCONT the planner's plans are applied again", thawed)
        await asyncio.sleep(1.0)
    await all_serving(env, res, "after SIGCONT")
    account(env, res, load.result)
    res.check("every request finally answered ok", load.result.final("ok") == len(load.result.requests),
              load.result.summary())
    res.wall_s = time.monotonic() - started
    return res


async def _applied_is(env: FaultEnv, stamp: tuple[str, int]) -> bool:
    return await env.any_applied_plan() == stamp


async def _applied_newer(env: FaultEnv, stamp: tuple[str, int]) -> bool:
    got = await env.any_applied_plan()
    return got is not None and got[0] == stamp[0] and got[1] > stamp[1]
