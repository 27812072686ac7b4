"""What a fault scenario reports, and the helpers scenarios share: polling, the workload,
and the request accounting (client view + replica taps)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import grpc

from bench.faults.env import MODEL, FaultEnv
from bench.faults.workload import AgentLoad, LoadConfig, LoadResult


@dataclass
class Check:
    name: str
    ok: bool
    detail: str = ""


@dataclass
class ScenarioResult:
    name: str
    faults: int = 0
    checks: list[Check] = field(default_factory=list)
    load: dict[str, int] = field(default_factory=dict)
    lost: int = 0
    duplicated: int = 0
    mismatched: int = 0
    replays: int = 0
    wall_s: float = 0.0
    notes: list[str] = field(default_factory=list)
    #: sessions that never finished (the fleet suite: not every request ok, not released, or
    #: still recorded by a router after the client released it)
    stuck: int = 0
    #: time to recover, wall seconds from the fault, by what recovered (the fleet suite)
    recovery_s: dict[str, float] = field(default_factory=dict)

    def check(self, name: str, ok: object, detail: Any = "") -> bool:
        self.checks.append(Check(name, bool(ok), str(detail)))
        return bool(ok)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    def failures(self) -> str:
        bad = [f"{c.name}: {c.detail}" for c in self.checks if not c.ok]
        return f"{self.name}: " + ("; ".join(bad) if bad else "all checks passed") + f" (load {self.load})"


async def until(pred: Callable[[], Awaitable[bool]], timeout_s: float, every_s: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if await pred():
                return True
        except (grpc.aio.AioRpcError, OSError, aiohttp.ClientError):
            pass
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(every_s)


def load_for(env: FaultEnv, name: str, **overrides: Any) -> AgentLoad:
    cfg = LoadConfig(env.addr.router_url, MODEL, name=f"{name}-{int(time.time() * 1000) % 100000}",
                     agents=4, turns=4, tool_s=0.05)
    for k, v in overrides.items():
        setattr(cfg, k, v)
    return AgentLoad(cfg)


def account(env: FaultEnv, res: ScenarioResult, load: LoadResult) -> None:
    """Request accounting of one scenario, from the client's view and the replicas' taps."""
    res.load = load.summary()
    lost = load.lost(env.router_down)
    res.lost = len(lost)
    markers = load.markers()
    dup = env.tap_log.duplicates(markers)
    res.duplicated = len(dup)
    at_replicas = env.tap_log.by_marker()
    mismatched = []
    replays = env.tap_log.replays(markers)
    if replays:
        res.notes.append(f"{len(replays)} attempts also computed for a router that had failed them over "
                         "(at-least-once at the replica after a timeout; answered once)")
    res.replays = len(replays)
    for a in load.attempts:
        done = sum(1 for r in at_replicas.get(a.marker, []) if r.completed and not r.abandoned)
        if a.kind == "ok" and done != 1:
            mismatched.append(f"{a.marker}: ok but completed {done}x at replicas")
    res.mismatched = len(mismatched)
    res.check("requests were made", len(load.requests) > 0, len(load.requests))
    res.check("no request lost", not lost, [f"{a.marker} {a.kind} {a.detail}" for a in lost[:3]])
    res.check("no request executed twice", not dup, dup[:3])
    res.check("every ok answer executed exactly once at a replica", not mismatched, mismatched[:3])


async def router_health(env: FaultEnv) -> dict[str, Any]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as http, \
            http.get(env.addr.router_url + "/health") as resp:
        return dict(await resp.json())


def ok_between(load: LoadResult, start_s: float, end_s: float) -> tuple[int, int]:
    """(ok attempts, all answered attempts) started in the window."""
    window = [a for a in load.between(start_s, end_s) if a.kind != "refused" and a.ended_s > 0]
    return sum(1 for a in window if a.kind == "ok"), len(window)


async def all_serving(env: FaultEnv, res: ScenarioResult, what: str, timeout_s: float = 20.0) -> None:
    status = await env.wait_serving(timeout_s=timeout_s)
    res.check(f"{what}: every service SERVING", all(s == "SERVING" for s in status.values()), status)
