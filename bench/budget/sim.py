"""Discrete-event run of one scenario under one budget policy, in virtual time.

One ``services.sim.engine.Engine`` (the vLLM V1 model) on the scenario's profile behind the router's
own core (``services.router.core.state.RouterCore``, a per-request routing policy, one
replica): every request arrives through ``RouterCore.arrive`` and is held or granted by the
core's admission (budget ``may_admit``: below the tenant's limit, and within its cap or into a
slot a draining donor has vacated; nothing is preempted), every completion goes through
``RouterCore.finish`` followed by ``dispatch`` (the router's pump). Every ``tick_s`` the *same*
budget core the service runs (``services.budget.core``) observes what the router's demand
record carries — held and in-flight requests per tenant from the core's counters, the p99 of
the tenant's last 1000 latencies measured from arrival at the router
(``services/router/store.py``) — and the engine's KV use, and its allocation is applied with
``RouterCore.set_caps`` followed by a pump, as ``services/router/runtime.py`` does. Granted
requests enter the engine in grant order (vLLM's FCFS queue). Time advances by the engine's
modelled step durations.
"""

from __future__ import annotations

import itertools
import math
import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from bench.budget.workload import Scenario, TenantLoad
from services.budget.core import (
    Allocation,
    BudgetConfig,
    BudgetPolicy,
    BudgetState,
    ClusterObservation,
    TenantConfig,
    TenantObservation,
)
from services.common.stats import percentile
from services.planner.core.registry import make_policy as make_router_policy
from services.router.core.model import CoreConfig, Grant, NewRequest, Replica, Usage
from services.router.core.state import RouterCore
from services.sim.engine import Engine, EngineRequest, get_profile
from services.sim.engine.tokens import SyntheticContent


@dataclass
class _Req:
    rid: str
    tenant: str
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    admitted_s: float = math.nan


@dataclass(frozen=True)
class TickTrace:
    """What one tick saw (held and in-flight requests per tenant) and decided."""

    at_s: float
    waiting: dict[str, int]
    in_flight: dict[str, int]
    caps: dict[str, int]
    limits: dict[str, int]


@dataclass
class PolicyRun:
    """Measured over [warmup_s, warmup_s + measure_s)."""

    policy: str
    seed: int
    total_tokens_per_s: float
    per_tenant_tokens_per_s: dict[str, float]
    completed_requests: int
    per_tenant_completed: dict[str, int]
    requests_per_s: float
    p99_latency_s: float
    per_tenant_p99_latency_s: dict[str, float]
    per_tenant_mean_latency_s: dict[str, float]
    per_tenant_mean_wait_s: dict[str, float]
    mean_kv_usage: float
    engine_busy_frac: float
    max_in_flight: int  # largest total in flight seen (never above B)
    mean_caps: dict[str, float]  # caps averaged over the ticks of the window
    final_caps: dict[str, int]
    moves_to: dict[str, int]
    holds: int
    ticks: int
    preemptions: int
    caps_timeline: list[tuple[float, dict[str, int]]] = field(default_factory=list)
    trace: list[TickTrace] = field(default_factory=list)  # every tick from t = 0 (diagnosis)
    wall_s: float = 0.0


def _p99(values: list[float]) -> float:
    return percentile(values, 99, empty=math.nan)


def _config(scenario: Scenario) -> BudgetConfig:
    return BudgetConfig(scenario.total_slots, tuple(
        TenantConfig(t.name, t.floor, t.weight, t.p99_slo_s) for t in scenario.tenants))


ROUTER_P99_WINDOW = 1000  # services/router/store.py: the router's p99 is over a tenant's last 1000 requests
ROUTER_POLICY = "least_loaded"  # a per-request policy: no planner in the loop, admission is the budget's alone
REPLICA = "sim-0"


def router_p99(values: deque[float]) -> float | None:
    """The p99 the router reports in its demand record (services/router/store.py ``p99``)."""
    return percentile(values, 99, method="higher") if values else None


def run_policy(scenario: Scenario, label: str, policy: BudgetPolicy, seed: int,
               check: Callable[[Allocation, RouterCore], None] | None = None) -> PolicyRun:
    """One scenario under one policy through the router's core and the budget core.

    ``check(allocation, core)``: called after every tick (tests assert invariants there)."""
    started = time.perf_counter()
    rng = random.Random(seed)
    end_s = scenario.warmup_s + scenario.measure_s
    lo_s = scenario.warmup_s
    engine = Engine(get_profile(scenario.profile))
    core = RouterCore(CoreConfig(gating=False, sticky=False), make_router_policy(ROUTER_POLICY))
    core.upsert_replica(Replica(REPLICA, "sim://0", kv_capacity_tokens=engine.capacity_tokens, healthy=True), 0.0)
    config = _config(scenario)
    loads = {t.name: t for t in scenario.tenants}
    names = config.names
    schedules = {n: load.schedule(end_s, rng) for n, load in loads.items()}
    arrivals = sorted((t, n) for n, (times, _) in schedules.items() for t in times)
    foresee = getattr(policy, "foresee", None)  # the foresight reference (bench/budget/foresight.py) only
    if foresee is not None:
        foresee({n: windows for n, (_, windows) in schedules.items() if windows})
    live: dict[str, _Req] = {}
    ids = itertools.count()
    reported: dict[str, deque[float]] = {n: deque(maxlen=ROUTER_P99_WINDOW) for n in names}
    held: dict[str, deque[float]] = {n: deque(maxlen=ROUTER_P99_WINDOW) for n in names}

    done: dict[str, list[float]] = {n: [] for n in names}
    waits: dict[str, list[float]] = {n: [] for n in names}
    tokens = dict.fromkeys(names, 0)
    moves = dict.fromkeys(names, 0)
    holds = ticks = 0
    kv_area = busy_s = 0.0
    timeline: list[tuple[float, dict[str, int]]] = []
    trace: list[TickTrace] = []
    alloc: Allocation | None = None
    now, next_tick, ai = 0.0, 0.0, 0
    preempt_start = 0
    max_in_flight = 0

    def in_window(t: float) -> bool:
        return lo_s <= t < end_s

    def start(grants: list[Grant]) -> None:
        nonlocal max_in_flight
        for g in grants:
            r = live[g.request_id]
            r.admitted_s = now
            content = SyntheticContent(r.rid, f"{r.tenant}-system", loads[r.tenant].system_prompt_tokens)
            engine.add_request(EngineRequest(r.rid, content, r.prompt_tokens, r.output_tokens))
        if grants and now >= lo_s:
            max_in_flight = max(max_in_flight, len(core.in_flight))

    def arrive(load: TenantLoad, at_s: float) -> None:
        rid = f"{load.name}-{next(ids)}"
        prompt = load.system_prompt_tokens + rng.randint(*load.prompt_tokens)
        live[rid] = _Req(rid, load.name, at_s, prompt, load.output_tokens)
        g = core.arrive(now, NewRequest(rid, rid, load.name, True, prompt, load.output_tokens))
        start([g] if g is not None else [])

    def tick() -> None:
        nonlocal alloc, holds, ticks, preempt_start
        obs = {n: TenantObservation(n, core.tenant_held.get(n, 0), core.tenant_in_flight.get(n, 0), now,
                                    router_p99(reported[n]), router_p99(held[n])) for n in names}
        state = BudgetState(now, config, obs, alloc, ClusterObservation(engine.kv_cache_usage))
        alloc = policy.reallocate(state)
        core.set_caps(alloc.caps, alloc.limits)  # the router applies the allocation and pumps
        start(core.dispatch(now))
        if check is not None:
            check(alloc, core)
        if in_window(now):
            ticks += 1
            holds += alloc.is_hold
            for n in alloc.moved_to:
                moves[n] += 1
            timeline.append((round(now - lo_s, 3), dict(alloc.caps)))
        trace.append(TickTrace(now, {n: obs[n].waiting for n in names}, {n: obs[n].in_flight for n in names},
                               dict(alloc.caps), dict(alloc.limits)))
        if now < lo_s:
            preempt_start = engine.num_preemptions_total

    tick()  # the router has the first allocation before the first request
    next_tick = scenario.tick_s
    for load in scenario.tenants:
        if load.kind == "closed":
            for _ in range(load.outstanding):
                arrive(load, 0.0)

    while now < end_s:
        if now >= next_tick:
            tick()
            next_tick += scenario.tick_s
        while ai < len(arrivals) and arrivals[ai][0] <= now:
            t_arr, name = arrivals[ai]
            arrive(loads[name], t_arr)
            ai += 1
        if engine.has_work():
            res = engine.step()
            if not res.idle:
                dt = res.duration_s
                overlap = max(0.0, min(now + dt, end_s) - max(now, lo_s))
                busy_s += overlap
                kv_area += engine.kv_cache_usage * overlap
                now += dt
                for f in res.finished:
                    r = live.pop(f.request_id)
                    core.finish(now, r.rid, Usage(f.prompt_tokens, f.output_tokens, f.cached_tokens))
                    reported[r.tenant].append(now - r.arrival_s)  # the router's latency: from arrival
                    held[r.tenant].append(now - r.admitted_s)  # and its slot hold: from admission
                    load = loads[r.tenant]
                    latency = now - (r.admitted_s if load.kind == "closed" else r.arrival_s)
                    if in_window(now):
                        done[r.tenant].append(latency)
                        waits[r.tenant].append(r.admitted_s - r.arrival_s)
                        tokens[r.tenant] += f.output_tokens
                    start(core.dispatch(now, r.tenant))  # the router pumps after every finish
                    if load.kind == "closed":  # the client sends its next request on the response
                        arrive(load, now)
                continue
        nxt = min(arrivals[ai][0] if ai < len(arrivals) else end_s, next_tick, end_s)
        overlap = max(0.0, min(nxt, end_s) - max(now, lo_s))
        kv_area += engine.kv_cache_usage * overlap
        now = max(nxt, now)

    span = scenario.measure_s
    all_lat = [x for n in names for x in done[n]]
    assert alloc is not None
    return PolicyRun(
        policy=label, seed=seed,
        total_tokens_per_s=sum(tokens.values()) / span,
        per_tenant_tokens_per_s={n: tokens[n] / span for n in names},
        completed_requests=len(all_lat),
        per_tenant_completed={n: len(done[n]) for n in names},
        requests_per_s=len(all_lat) / span,
        p99_latency_s=_p99(all_lat),
        per_tenant_p99_latency_s={n: _p99(done[n]) for n in names},
        per_tenant_mean_latency_s={n: float(np.mean(done[n])) if done[n] else math.nan for n in names},
        per_tenant_mean_wait_s={n: float(np.mean(waits[n])) if waits[n] else math.nan for n in names},
        mean_kv_usage=kv_area / span,
        engine_busy_frac=busy_s / span,
        max_in_flight=max_in_flight,
        mean_caps={n: float(np.mean([c[n] for _, c in timeline])) if timeline else math.nan for n in names},
        final_caps=dict(alloc.caps),
        moves_to=moves, holds=holds, ticks=ticks,
        preemptions=engine.num_preemptions_total - preempt_start,
        caps_timeline=timeline,
        trace=trace,
        wall_s=time.perf_counter() - started,
    )
