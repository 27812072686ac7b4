"""Data-path faults: a replica killed mid-stream, and the TCP fault proxy (latency,
blackhole, connection reset) between the services and Redis and between the router and
the replicas (docs/architecture.md#failure-modes-and-degraded-behaviour)."""

from __future__ import annotations

import asyncio
import time

from bench.faults.env import FaultEnv
from bench.faults.outcome import ScenarioResult, account, all_serving, load_for, ok_between, until
from bench.faults.workload import LoadResult, running

# ---------------------------------------------------------------------------- replicas


async def kill_replica(env: FaultEnv) -> ScenarioResult:
    """kill -9 the replica that is streaming: its streams end with a clean error event and
    ``[DONE]`` (the clients retry), its sessions are re-placed on another replica, and it
    is taken back when it returns."""
    res = ScenarioResult("kill_replica")
    started = time.monotonic()
    load = load_for(env, "krep", output_tokens=1500, stream_every=1, turns=3)
    async with running(load):
        streaming = await until(lambda: _active_anywhere(env, 2), 8, 0.02)
        res.check("streams in flight", streaming)
        name = _busiest(env)
        victims = {r.marker for r in env.tap_log.completions() if r.replica == name and not r.ended and r.marker}
        env.kill(name)
        res.faults += 1
        killed = time.monotonic()
        res.check(f"router marks {name} unhealthy", await until(lambda: _unhealthy(env, name), 5))
        placed = await until(lambda: _none_admitted_on(env, name), 5)
        res.check(f"sessions re-placed off {name}", placed)
        served = await until(lambda: _ok_after(load.result, killed + 0.3, 2), 10)
        later = [a for a in load.result.attempts if a.started_s > killed + 0.3 and a.kind == "ok"]
        res.check("requests after the kill are served elsewhere", served and all(a.replica != name for a in later),
                  {a.replica for a in later})
        by_marker = {a.marker: a for a in load.result.attempts}
        kinds = {m: by_marker[m].kind for m in victims if m in by_marker}
        res.check("streams on the killed replica ended cleanly (error event + [DONE]) or completed",
                  kinds and all(k in ("clean_error", "ok") for k in kinds.values()), kinds)
        errors = sum(1 for k in kinds.values() if k == "clean_error")
        res.notes.append(f"{errors} of {len(kinds)} streams on {name} at the kill ended with an error event")
        env.restart(name)
        back = await until(lambda: _healthy(env, name), 10)
        res.check(f"router takes {name} back after its restart", back)
    account(env, res, load.result)
    res.check("every request finally answered ok", load.result.final("ok") == len(load.result.requests),
              load.result.summary())
    res.wall_s = time.monotonic() - started
    return res


def _busiest(env: FaultEnv) -> str:
    """The replica with the most requests in flight (ties: the most received overall)."""
    active: dict[str, int] = {}
    total: dict[str, int] = {}
    for r in env.tap_log.completions():
        total[r.replica] = total.get(r.replica, 0) + 1
        active[r.replica] = active.get(r.replica, 0) + (not r.ended)
    return max(total, key=lambda n: (active.get(n, 0), total[n]))


async def _active_anywhere(env: FaultEnv, at_least: int) -> bool:
    counts: dict[str, int] = {}
    for r in env.tap_log.completions():
        if not r.ended:
            counts[r.replica] = counts.get(r.replica, 0) + 1
    return max(counts.values(), default=0) >= at_least


async def _ok_after(load: LoadResult, start_s: float, n: int) -> bool:
    return sum(1 for a in load.attempts if a.started_s > start_s and a.kind == "ok") >= n


async def _unhealthy(env: FaultEnv, name: str) -> bool:
    return any(rep.id == name and not rep.healthy for rep in await env.replicas())


async def _active_on(env: FaultEnv, name: str, at_least: int) -> bool:
    return sum(1 for r in env.tap_log.completions() if r.replica == name and not r.ended) >= at_least


async def _none_admitted_on(env: FaultEnv, name: str) -> bool:
    return not any(s.admitted and s.replica == name for s in await env.sessions())


async def _healthy(env: FaultEnv, name: str) -> bool:
    return any(rep.id == name and rep.healthy for rep in await env.replicas())


# ---------------------------------------------------------------------------- fault proxy


async def proxy_redis(env: FaultEnv) -> ScenarioResult:
    """The TCP fault proxy between the services and Redis: added latency (all services),
    blackhole (the router's connections, then everyone's), connection resets."""
    res = ScenarioResult("proxy_redis")
    started = time.monotonic()
    load = load_for(env, "predis")
    async with running(load):
        await asyncio.sleep(1.0)
        env.set_redis_mode("latency", 0.05)
        res.faults += 1
        t = time.monotonic()
        await asyncio.sleep(2.0)
        ok, n = ok_between(load.result, t, time.monotonic())
        res.check("50 ms Redis latency: requests served", n > 0 and ok == n, f"{ok}/{n} ok")
        env.set_redis_mode("pass")
        env.set_redis_mode("blackhole", services=("router",))
        res.faults += 1
        t = time.monotonic()
        await asyncio.sleep(2.5)
        ok, n = ok_between(load.result, t, time.monotonic())
        res.check("router's Redis blackholed: requests served from memory", n > 0 and ok == n, f"{ok}/{n} ok")
        env.set_redis_mode("pass")
        await all_serving(env, res, "after the router's blackhole")
        env.set_redis_mode("blackhole")
        res.faults += 1
        t = time.monotonic()
        # the health loop's ping has one Redis timeout (1 s here) to answer, polled every 1 s:
        # NOT_SERVING within about 2 s (it took 8-9 s when the ping went through the retries)
        flipped = await until(lambda: _none_serving(env), 6, 0.2)
        statuses = {n: await env.health(n) for n in ("router", "planner", "predictor", "budget")}
        res.check("services report NOT_SERVING while Redis is unreachable", flipped,
                  f"after {time.monotonic() - t:.1f} s: {statuses}")
        res.notes.append(f"health went NOT_SERVING {time.monotonic() - t:.1f} s after Redis became unreachable")
        ok, n = ok_between(load.result, t, time.monotonic())
        res.check("Redis unreachable for everyone: requests served", n > 0 and ok == n, f"{ok}/{n} ok")
        env.set_redis_mode("pass")
        await all_serving(env, res, "after everyone's blackhole")
        env.set_redis_mode("reset")
        res.faults += 1
        await asyncio.sleep(0.5)
        env.set_redis_mode("pass")
        await all_serving(env, res, "after connection resets")
        t = time.monotonic()
        await asyncio.sleep(1.0)
        ok, n = ok_between(load.result, t, time.monotonic())
        res.check("requests succeed after the Redis faults", n > 0 and ok == n, f"{ok}/{n} ok")
    account(env, res, load.result)
    res.check("every request finally answered ok", load.result.final("ok") == len(load.result.requests),
              load.result.summary())
    res.wall_s = time.monotonic() - started
    return res


async def _none_serving(env: FaultEnv) -> bool:
    statuses = [await env.health(n) for n in ("router", "planner", "predictor", "budget")]
    return all(st != "SERVING" for st in statuses)


async def proxy_replica(env: FaultEnv) -> ScenarioResult:
    """The TCP fault proxy between the router and the busiest replica: latency, connection
    resets (requests fail over before their first byte or end with an error event), blackhole
    (a hung replica: its streams fail after the router's read timeout, new requests go
    elsewhere)."""
    res = ScenarioResult("proxy_replica")
    started = time.monotonic()
    load = load_for(env, "prep", output_tokens=200)
    async with running(load):
        await asyncio.sleep(1.0)
        name = _busiest(env)
        tap = env.taps[int(name.split("-")[1])]
        env.set_mode(tap, "latency", 0.02)
        res.faults += 1
        t = time.monotonic()
        await asyncio.sleep(1.5)
        ok, n = ok_between(load.result, t, time.monotonic())
        res.check("replica latency: requests served", n > 0 and ok == n, f"{ok}/{n} ok")
        env.set_mode(tap, "pass")
        await until(lambda: _active_anywhere(env, 1), 5, 0.01)
        env.set_mode(tap, "reset")
        res.faults += 1
        res.check(f"router marks {name} unhealthy under resets", await until(lambda: _unhealthy(env, name), 5))
        t = time.monotonic()
        served = await until(lambda: _ok_after(load.result, t, 2), 10)
        res.check("requests served elsewhere during resets", served)
        env.set_mode(tap, "pass")
        back = await until(lambda: _healthy(env, name), 10)
        res.check(f"{name} healthy again after resets", back)
        name = _busiest(env)
        tap = env.taps[int(name.split("-")[1])]
        await until(lambda: _active_anywhere(env, 1), 5, 0.01)
        env.set_mode(tap, "blackhole")
        res.faults += 1
        res.check(f"router marks the hung {name} unhealthy", await until(lambda: _unhealthy(env, name), 5))
        t = time.monotonic()
        served = await until(lambda: _ok_after(load.result, t, 2), 10)
        res.check("requests served elsewhere while a replica hangs", served)
        await asyncio.sleep(3.5)  # past the router's read timeout: streams stuck on it fail
        env.set_mode(tap, "pass")
        back = await until(lambda: _healthy(env, name), 10)
        res.check(f"{name} healthy again after the blackhole", back)
        await asyncio.sleep(0.5)
    failovers = sum(1 for m, recs in env.tap_log.by_marker().items() if m in load.result.markers()
                    and len(recs) > 1 and sum(r.completed for r in recs) == 1)
    res.notes.append(f"{failovers} attempts failed over to another replica before their first byte; "
                     f"{load.result.count('clean_error')} ended with a clean error")
    account(env, res, load.result)
    res.check("every request finally answered ok", load.result.final("ok") == len(load.result.requests),
              load.result.summary())
    res.wall_s = time.monotonic() - started
    return res
