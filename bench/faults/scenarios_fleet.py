"""Fault scenarios against the fleet (``FleetEnv``: 3 routers, 2 planners, 2 budget services, a
Redis Cluster of 3 masters with a replica each, the predictor, emulated replicas), shared by
``tests/faults/test_faults_fleet.py`` and ``tao check faults --fleet``.

Each scenario runs an ``AgentLoad`` spread over the routers (``spread``: "hash", every request
of a session to the router its id hashes to, as an L7 balancer hashing on ``x-session-id``
would; or "round_robin") with tool calls reported to the predictor, kills one process with
SIGKILL mid-run, waits for the fleet to recover, lets every session in progress finish, and
reports (``ScenarioResult``):

- requests lost: attempts with no proper answer; a connection cut counts unless the attempt
  was sent to the router that was killed, while it was down (the client retries those on
  another router, as a balancer does);
- requests duplicated: one client attempt executed to completion more than once at the
  replicas (from the taps), and ok answers that did not complete exactly once there;
- sessions stuck: sessions whose requests did not all end ok or whose release was not
  answered, plus sessions a router still records in Redis after the client released them;
- recovery (wall seconds from the kill): what took over when, and ``max_gap``, the longest
  time after the kill in which no request completed.

Recovery times are reported, not asserted (no speed assumptions); every wait has a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Coroutine
from functools import partial
from typing import Any

import grpc
import redis as redis_sync
from redis.cluster import ClusterNode, RedisCluster

from bench.faults.fleet_env import MODEL, FleetEnv
from bench.faults.outcome import ScenarioResult, until
from bench.faults.workload import AgentLoad, LoadConfig, LoadResult, running
from services.common import keys
from tao.budget.v1 import budget_pb2, budget_pb2_grpc

#: generous deadlines (wall seconds): the machine may be slow and shared
TAKEOVER_TIMEOUT_S = 45.0
FLOW_TIMEOUT_S = 45.0


def fleet_load(env: FleetEnv, name: str, *, agents: int = 6, turns: int = 6, spread: str = "hash",
               tools: Any = None) -> AgentLoad:
    cfg = LoadConfig(env.router_urls[0], MODEL, name=f"{name}-{int(time.time() * 1000) % 100000}",
                     agents=agents, turns=turns, tool_s=0.05, router_urls=tuple(env.router_urls), spread=spread,
                     finish_sessions=True, request_timeout_s=90.0, max_attempts=20, retry_pause_s=0.25)
    return AgentLoad(cfg, tools)


def _cluster_client(env: FleetEnv) -> RedisCluster:
    assert env.cluster is not None
    return RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", n.port)  # type: ignore[no-untyped-call]
                                       for n in env.cluster.live()],
                        decode_responses=True, socket_timeout=2, socket_connect_timeout=2)


async def redis_call(env: FleetEnv, fn: Callable[[RedisCluster], Any]) -> Any:
    """``fn(client)`` on a fresh cluster client, in a thread (the agent load runs on this event
    loop, and a cluster call waits up to its socket timeouts during a failover); None when the
    cluster does not answer."""
    return await asyncio.to_thread(_redis_call, env, fn)


def _redis_call(env: FleetEnv, fn: Callable[[RedisCluster], Any]) -> Any:
    try:
        client = _cluster_client(env)
    except (redis_sync.RedisError, OSError):
        return None
    try:
        return fn(client)
    except (redis_sync.RedisError, OSError):
        return None
    finally:
        client.close()


async def plan_stamp(env: FleetEnv) -> tuple[str, int] | None:
    raw = await redis_call(env, lambda c: c.get(keys.PLAN))
    if not raw:
        return None
    rec = json.loads(raw)
    return str(rec.get("epoch", "")), int(rec.get("rev", 0))


def ok_count(load: AgentLoad) -> int:
    return load.result.count("ok")


async def _wait_flow(res: ScenarioResult, load: AgentLoad, what: str, extra: int, timeout_s: float = FLOW_TIMEOUT_S,
                     after: float | None = None) -> float | None:
    """Wait until ``extra`` more requests (started after ``after`` when given) have ended ok;
    returns when, or None (and a failed check) at the deadline."""
    start = time.monotonic()

    def done() -> int:
        return sum(1 for a in load.result.attempts if a.kind == "ok" and a.ended_s > 0
                   and (after is None or a.started_s >= after))

    base = 0 if after is not None else done()

    async def enough() -> bool:
        return done() >= base + extra

    ok = await until(enough, timeout_s)
    res.check(what, ok, f"{done() - base} of {extra} ok within {time.monotonic() - start:.1f} s")
    return time.monotonic() if ok else None


def max_gap(load: LoadResult, start_s: float, end_s: float) -> float:
    """The longest time in [start_s, end_s] without a request completing ok."""
    ends = sorted(a.ended_s for a in load.attempts if a.kind == "ok" and start_s <= a.ended_s <= end_s)
    points = [start_s, *ends]
    return max((b - a for a, b in zip(points, points[1:], strict=False)), default=end_s - start_s)


@contextlib.asynccontextmanager
async def reporting(env: FleetEnv, res: ScenarioResult) -> AsyncIterator[Any]:
    """Tool events of the workload to the predictor; afterwards: every event delivered, none dropped."""
    from services.driver.reporter_adapter import ReporterToolEvents

    tools = ReporterToolEvents(env.address("predictor"), time_scale=env.config.time_scale)
    reporter = tools._reporter
    try:
        yield tools
        res.check("tool events delivered to the predictor", await reporter.flush(reporter.backoff_max_s + 15.0),
                  f"pending {reporter.pending}")
        res.check("no tool event dropped by the reporter", reporter.stats.dropped == 0, reporter.stats.dropped)
    finally:
        await tools.close()


def account_fleet(env: FleetEnv, res: ScenarioResult, load: LoadResult) -> None:
    """Lost, duplicated and stuck (client side) of one scenario (module docstring)."""
    res.load = load.summary()
    down = env.down_windows()
    url_name = dict(zip(env.router_urls, env.routers, strict=True))
    lost = []
    for a in load.attempts:
        if a.kind == "lost":
            lost.append(a)
        elif a.kind == "cut" and not any(a.started_s <= end and a.ended_s >= start
                                         for start, end in down.get(url_name.get(a.router, ""), [])):
            lost.append(a)
    res.lost = len(lost)
    markers = load.markers()
    dup = env.tap_log.duplicates(markers)
    at_replicas = env.tap_log.by_marker()
    mismatched = []
    for a in load.attempts:
        done = sum(1 for r in at_replicas.get(a.marker, []) if r.completed and not r.abandoned)
        if a.kind == "ok" and done != 1:
            mismatched.append(f"{a.marker}: ok but completed {done}x at replicas")
    res.duplicated = len(dup) + len(mismatched)
    res.mismatched = len(mismatched)
    replays = env.tap_log.replays(markers)
    res.replays = len(replays)
    if replays:
        res.notes.append(f"{len(replays)} attempts also computed for a router that had given up on them "
                         "(abandoned at the replica; answered once)")
    cut = load.count("cut")
    if cut:
        res.notes.append(f"{cut} attempts cut (sent to a router as it was killed), retried on another router")
    res.check("requests were made", len(load.requests) > 0, len(load.requests))
    res.check("no request lost", not lost, [f"{a.marker} {a.kind} {a.detail} via {a.router}" for a in lost[:3]])
    res.check("no request executed twice", not dup, dup[:3])
    res.check("every ok answer executed exactly once at a replica", not mismatched, mismatched[:3])
    last = {a.request: a for a in load.attempts}
    not_ok = [f"{r}: {k}, last attempt {last[r].status} {last[r].detail!r} via {last[r].router}"
              for r, k in load.requests.items() if k != "ok" and r in last]
    res.check("every request finally answered ok", not not_ok, not_ok[:3])
    res.check("every session finished (all requests ok, released)", not load.unfinished, load.unfinished[:3])


async def server_leftovers(env: FleetEnv, res: ScenarioResult, load: LoadResult, timeout_s: float = 30.0) -> None:
    """After the load: no session of the run may stay recorded by a router (released sessions
    are deleted from ``SESSIONS`` by their router's write-behind; with the router fleet, from
    ``SESSION_OWNERS`` too) once the routers have had ``timeout_s`` to flush."""
    ours = {a.session for a in load.attempts}
    families = [keys.SESSIONS]
    if env.router_fleet:
        families.append(keys.SESSION_OWNERS)

    async def left() -> set[str] | None:
        found: set[str] = set()
        for family in families:
            names = await redis_call(env, partial(_hkeys, family))
            if names is None:
                return None
            found |= ours & set(names)
        return found

    async def clean() -> bool:
        got = await left()
        return got is not None and not got

    await until(clean, timeout_s, 0.25)
    remaining = await left()
    stuck_server = sorted(remaining) if remaining is not None else ["(Redis did not answer)"]
    res.stuck = len(load.unfinished) + len(stuck_server)
    res.check("no released session left recorded by a router", not stuck_server,
              f"{len(stuck_server)}: {stuck_server[:3]}")


async def flows_again(res: ScenarioResult, load: AgentLoad, what: str) -> float:
    """After the fault: requests started from now on succeed again; the time that was checked."""
    await _wait_flow(res, load, what, 2 * load.config.agents, after=time.monotonic())
    return time.monotonic()


@contextlib.asynccontextmanager
async def flowing(env: FleetEnv, res: ScenarioResult, name: str, *, spread: str, agents: int,
                  turns: int) -> AsyncIterator[AgentLoad]:
    """The scenario's agent load, its tool events reported to the predictor, once requests flow."""
    async with reporting(env, res) as tools:
        load = fleet_load(env, name, spread=spread, agents=agents, turns=turns, tools=tools)
        async with running(load):
            await _wait_flow(res, load, "requests flow before the kill", 2 * load.config.agents)
            yield load


def kill(env: FleetEnv, res: ScenarioResult, name: str) -> float:
    """kill -9 one service process; the time of the fault."""
    env.kill(name)
    res.faults += 1
    return time.monotonic()


async def standby_leads(env: FleetEnv, res: ScenarioResult, role: str, leader: str, t0: float,
                        what: str) -> str | None:
    """The standby of ``role`` takes the lease the killed ``leader`` held; when, from ``t0``."""
    new = await env.wait_leader(role, TAKEOVER_TIMEOUT_S, not_=leader)
    if res.check(what, new is not None, await env.leaders(role)):
        res.recovery_s["standby_leads"] = time.monotonic() - t0
    return new


async def settle(env: FleetEnv, res: ScenarioResult, load: LoadResult, t0: float, end: float) -> None:
    """After a fault's load: the longest gap from the fault at ``t0`` to ``end``, then what
    was lost, duplicated or left stuck."""
    res.recovery_s["max_gap"] = max_gap(load, t0, end)
    account_fleet(env, res, load)
    await server_leftovers(env, res, load)


def _hkeys(key: str, client: RedisCluster) -> list[str]:
    return [str(k) for k in client.hkeys(key)]


def _finish(res: ScenarioResult, started: float) -> ScenarioResult:
    res.wall_s = time.monotonic() - started
    return res


async def _all_back(env: FleetEnv, res: ScenarioResult, started: float, timeout_s: float = 45.0) -> ScenarioResult:
    """The scenario's last check: the stack is whole again; the result, with its wall time."""
    status = await env.wait_serving(timeout_s)
    res.check("afterwards: every service SERVING, one planner and one budget leader",
              all(s in ("SERVING", "1") for s in status.values()), status)
    return _finish(res, started)


# ---------------------------------------------------------------------------- planner


async def kill_planner(env: FleetEnv, spread: str = "hash", agents: int = 6, turns: int = 6) -> ScenarioResult:
    """kill -9 the leader planner mid-run: the standby acquires the lease (within about the
    lease TTL), publishes plans of a new epoch, every router applies them, and a plan of the
    dead leader's epoch is rejected whatever its revision."""
    res = ScenarioResult("kill_planner")
    started = time.monotonic()
    leader = await env.wait_leader("planner", TAKEOVER_TIMEOUT_S)
    if not res.check("one planner leads before the kill", leader is not None, await env.leaders("planner")):
        return _finish(res, started)
    assert leader is not None
    async with flowing(env, res, "fplan", spread=spread, agents=agents, turns=turns) as load:
        before = await plan_stamp(env)
        res.check("a plan was published before the kill", before is not None, before)
        t0 = kill(env, res, leader)
        new = await standby_leads(env, res, "planner", leader, t0, "the standby planner takes the lease")

        async def published() -> bool:
            stamp = await plan_stamp(env)
            return stamp is not None and before is not None and stamp[0] != before[0]

        if res.check("the new leader publishes plans of a new epoch", await until(published, TAKEOVER_TIMEOUT_S)):
            res.recovery_s["plan_published"] = time.monotonic() - t0
        now_stamp = await plan_stamp(env)

        async def routers_applied() -> bool:
            applied = await env.applied_plans()
            seen = [v for v in applied.values() if v is not None]
            return bool(seen) and now_stamp is not None and all(v[0] == now_stamp[0] for v in seen)

        if res.check("every router applies the new leader's plans", await until(routers_applied,
                                                                                 TAKEOVER_TIMEOUT_S, 0.25),
                     await env.applied_plans()):
            res.recovery_s["routers_applied"] = time.monotonic() - t0
        if before is not None and now_stamp is not None:
            await _forged_old_epoch_plan(env, res, before[0], now_stamp[0])
        end = await flows_again(res, load, "requests succeed after the takeover")
    ttl = env.config.lease_ttl_s
    took = res.recovery_s.get("standby_leads")
    if took is not None:
        res.notes.append(f"standby led {took:.2f} s after the kill (lease {ttl:g} s; target <= 2 x lease = "
                         f"{2 * ttl:g} s: {'met' if took <= 2 * ttl else 'NOT met'})")
    await settle(env, res, load.result, t0, end)
    env.restart(leader)

    async def one_leader() -> bool:
        return await env.leaders("planner") == [new]

    res.check("the restarted planner stays a standby", await until(one_leader, 10), await env.leaders("planner"))
    return await _all_back(env, res, started)


async def _forged_old_epoch_plan(env: FleetEnv, res: ScenarioResult, old_epoch: str, new_epoch: str) -> None:
    """A late plan of the deposed leader's epoch (higher revision) reaching Redis and every
    router: no router applies it."""
    raw = await redis_call(env, lambda c: c.get(keys.PLAN))
    if not raw:
        return
    forged = dict(json.loads(raw), epoch=old_epoch, rev=10**9,
                  created_at_unix_s=time.time() * env.config.time_scale)
    body = json.dumps(forged)
    def write(c: RedisCluster) -> None:
        c.set(keys.PLAN, body)
        c.publish(keys.PLAN_CHANNEL, body)

    await redis_call(env, write)
    await asyncio.sleep(1.0)  # the routers' feeds read it (pub/sub, or their next poll)
    applied = await env.applied_plans()
    wrong = {r: v for r, v in applied.items() if v is not None and v[0] == old_epoch}
    res.check("a plan of the dead leader's epoch is rejected by every router", not wrong, wrong or applied)


# ---------------------------------------------------------------------------- budget


async def _allocation(env: FleetEnv, name: str) -> budget_pb2.Allocation:
    async with grpc.aio.insecure_channel(env.address(name)) as ch:
        reply = await budget_pb2_grpc.BudgetServiceStub(ch).GetAllocation(budget_pb2.GetAllocationRequest(),
                                                                           timeout=3)
    return reply.allocation


async def kill_budget(env: FleetEnv, spread: str = "hash", agents: int = 6, turns: int = 6) -> ScenarioResult:
    """kill -9 the leader budget service mid-run: the standby takes the lease, resumes the
    stored tenant configuration and publishes caps of a new epoch that sum to the budget."""
    res = ScenarioResult("kill_budget")
    started = time.monotonic()
    total = env.config.total_budget
    leader = await env.wait_leader("budget", TAKEOVER_TIMEOUT_S)
    if not res.check("one budget service leads before the kill", leader is not None, await env.leaders("budget")):
        return _finish(res, started)
    assert leader is not None
    async with flowing(env, res, "fbud", spread=spread, agents=agents, turns=turns) as load:
        before = await _allocation(env, leader)
        res.check("caps published before the kill", sum(before.caps.values()) == total, dict(before.caps))
        t0 = kill(env, res, leader)
        new = await standby_leads(env, res, "budget", leader, t0, "the standby budget service takes the lease")
        if new is not None:
            async def republished() -> bool:
                alloc = await _allocation(env, new)
                return alloc.revision.epoch != before.revision.epoch and sum(alloc.caps.values()) == total

            if res.check("the new leader publishes caps of a new epoch summing to the budget",
                         await until(republished, TAKEOVER_TIMEOUT_S, 0.25)):
                res.recovery_s["caps_published"] = time.monotonic() - t0
            after = await _allocation(env, new)
            res.check("the standby resumed the stored configuration", after.total == total, after.total)
        end = await flows_again(res, load, "requests succeed after the takeover")
    await settle(env, res, load.result, t0, end)
    env.restart(leader)
    return await _all_back(env, res, started)


# ---------------------------------------------------------------------------- Redis master


async def kill_redis_master(env: FleetEnv, spread: str = "hash", agents: int = 6, turns: int = 6) -> ScenarioResult:
    """kill -9 the Redis Cluster master that holds every TAO key (the ``{tao}`` slot) mid-run:
    its replica is promoted after the cluster node timeout; every service's cluster client
    finds the new master; plans keep being published and applied; requests keep succeeding.
    The killed node is started again and rejoins as a replica."""
    res = ScenarioResult("kill_redis_master")
    started = time.monotonic()
    async with flowing(env, res, "fredis", spread=spread, agents=agents, turns=turns) as load:
        before = await plan_stamp(env)
        res.check("a plan was published before the kill", before is not None, before)
        dead = env.kill_redis_master()
        res.faults += 1
        t0 = time.monotonic()
        res.notes.append(f"killed the master on port {dead.port} (the {{tao}} slot)")
        try:
            promoted = await asyncio.to_thread(env.wait_redis_failover, dead, TAKEOVER_TIMEOUT_S)
        except RuntimeError as exc:
            res.check("a replica is promoted", False, str(exc))
            promoted = None
        if promoted is not None:
            res.recovery_s["replica_promoted"] = time.monotonic() - t0
            res.check("a replica is promoted", promoted.port != dead.port, promoted.port)

        async def plans_flow() -> bool:
            stamp = await plan_stamp(env)
            return stamp is not None and before is not None and stamp != before

        if res.check("plans are published through the new master", await until(plans_flow, TAKEOVER_TIMEOUT_S,
                                                                              0.25)):
            res.recovery_s["plan_published"] = time.monotonic() - t0
        now_stamp = await plan_stamp(env)

        async def routers_applied() -> bool:
            applied = await env.applied_plans()
            seen = [v for v in applied.values() if v is not None]
            return (bool(seen) and now_stamp is not None
                    and all(v[0] != now_stamp[0] or v[1] >= now_stamp[1] for v in seen)
                    and all(v != before for v in seen))

        if res.check("every router applies a plan published after the failover",
                     await until(routers_applied, TAKEOVER_TIMEOUT_S, 0.25), await env.applied_plans()):
            res.recovery_s["routers_applied"] = time.monotonic() - t0
        end = await flows_again(res, load, "requests succeed after the failover")
    await settle(env, res, load.result, t0, end)
    try:
        await asyncio.to_thread(_rejoin, env, dead)
        res.check("the killed master rejoins (as a replica)", env.redis_master().port != dead.port)
    except RuntimeError as exc:
        res.check("the killed master rejoins (as a replica)", False, str(exc))

    async def leaders() -> bool:
        return len(await env.leaders("planner")) == 1 and len(await env.leaders("budget")) == 1

    res.check("one planner and one budget leader after the failover", await until(leaders, TAKEOVER_TIMEOUT_S),
              {k: await env.leaders(k) for k in ("planner", "budget")})
    return await _all_back(env, res, started)


def _rejoin(env: FleetEnv, node: Any) -> None:
    assert env.cluster is not None
    node.start()
    env.cluster.wait_healthy(TAKEOVER_TIMEOUT_S)


# ---------------------------------------------------------------------------- router


async def kill_router(env: FleetEnv, spread: str = "hash", agents: int = 6, turns: int = 6) -> ScenarioResult:
    """kill -9 one router mid-run and leave it down: clients whose connection it cut retry on
    another router (as an L7 balancer does); the sessions it served continue on the other
    routers (with the router fleet: taken over once its member lease expires); none is lost
    or left behind. The router is restarted at the end and rejoins."""
    res = ScenarioResult("kill_router")
    started = time.monotonic()
    victim = env.routers[0]
    victim_url = env.router_urls[0]
    if not env.router_fleet:
        res.notes.append("routers run WITHOUT fleet mode (--no-router-fleet): independent "
                         "routers on one Redis; the dead router's sessions continue on another router from "
                         "scratch")
    async with flowing(env, res, "frout", spread=spread, agents=agents, turns=turns) as load:

        def victim_sessions() -> set[str]:
            """Sessions the victim served that have requests left (they must continue elsewhere)."""
            done = Counter(a.session for a in load.result.attempts if a.kind == "ok")
            return {a.session for a in load.result.attempts if a.router == victim_url and a.kind == "ok"
                    and done[a.session] < load.config.turns}

        async def victim_busy() -> bool:
            return len(victim_sessions()) >= 1

        res.check("the victim router serves a session mid-way at the kill",
                  await until(victim_busy, FLOW_TIMEOUT_S, 0.02), len(victim_sessions()))
        # no await between the check and the kill: the set cannot change in between
        served = victim_sessions()
        t0 = kill(env, res, victim)

        def continued() -> dict[str, float]:
            """Victim sessions with a request after the kill -> when the first such ended ok."""
            out: dict[str, float] = {}
            for a in load.result.attempts:
                if a.session in served and a.started_s >= t0 and a.kind == "ok" and a.ended_s > 0:
                    out[a.session] = min(out.get(a.session, a.ended_s), a.ended_s)
            return out

        def pending() -> set[str]:
            """Victim sessions that tried after the kill and have no ok answer yet."""
            tried = {a.session for a in load.result.attempts if a.session in served and a.started_s >= t0}
            return tried - set(continued())

        async def moved() -> bool:
            return len(continued()) >= 1 and not pending()

        if res.check("the dead router's sessions continue on other routers", await until(moved,
                                                                                       TAKEOVER_TIMEOUT_S),
                     f"{len(continued())} continued, pending {sorted(pending())[:3]}"):
            res.recovery_s["sessions_continued"] = max(continued().values()) - t0
        if env.router_fleet:
            await _member_expired(env, res, victim, t0)
        end = await flows_again(res, load, "requests succeed with one router down")
    await settle(env, res, load.result, t0, end)
    env.restart(victim)
    return await _all_back(env, res, started)


async def _member_expired(env: FleetEnv, res: ScenarioResult, victim: str, t0: float) -> None:
    def check(c: RedisCluster) -> bool:
        score = c.zscore(keys.ROUTER_ALIVE, victim)  # a deadline in ms of Redis TIME: this machine's clock
        return score is None or float(score) < time.time() * 1000

    async def gone() -> bool:
        return bool(await redis_call(env, check))

    if res.check("the dead router's member lease expires", await until(gone, TAKEOVER_TIMEOUT_S, 0.25)):
        res.recovery_s["member_expired"] = time.monotonic() - t0


FleetScenario = Callable[..., Coroutine[Any, Any, ScenarioResult]]

FLEET_SCENARIOS: dict[str, FleetScenario] = {
    "kill_planner": kill_planner,
    "kill_redis_master": kill_redis_master,
    "kill_router": kill_router,
    "kill_budget": kill_budget,
}
