"""Discrete-event run of one scenario under one budget policy, in virtual time.

One ``sim.engine.Engine`` (the vLLM V1 model) on the scenario's profile; in front of it the
router's admission rule (``Allocation.admits``: below the tenant's limit, and within its cap
or into a slot a draining donor has vacated; held requests wait FIFO, nothing is
preempted, the in-flight total never exceeds B); every
``tick_s`` the *same* budget core the service runs (``services.budget.core``) observes each
tenant's waiting and in-flight counts, its p99 latency over the last 10 s and the engine's KV
use, and returns the next allocation. Requests forwarded at one instant enter the engine in
arrival order (vLLM's FCFS queue). Time advances by the engine's modelled step durations.
"""

from __future__ import annotations

import itertools
import math
import random
import time
from collections import deque
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
from sim.engine import Engine, EngineRequest, get_profile
from sim.engine.tokens import SyntheticContent

P99_WINDOW_S = 10.0


@dataclass
class _Req:
    rid: str
    tenant: str
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    admitted_s: float = math.nan


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
    max_in_flight: int  # largest total in flight seen (<= B unless overcommit)
    mean_caps: dict[str, float]  # caps averaged over the ticks of the window
    final_caps: dict[str, int]
    moves_to: dict[str, int]
    holds: int
    ticks: int
    preemptions: int
    caps_timeline: list[tuple[float, dict[str, int]]] = field(default_factory=list)
    wall_s: float = 0.0


def _p99(values: list[float]) -> float:
    return percentile(values, 99, empty=math.nan)


def _config(scenario: Scenario) -> BudgetConfig:
    return BudgetConfig(scenario.total_slots, tuple(
        TenantConfig(t.name, t.floor, t.weight, t.p99_slo_s) for t in scenario.tenants))


def run_policy(scenario: Scenario, label: str, policy: BudgetPolicy, seed: int,
               overcommit: bool = False) -> PolicyRun:
    """``overcommit``: admit up to each limit without waiting for vacated slots (ablation)."""
    started = time.perf_counter()
    rng = random.Random(seed)
    end_s = scenario.warmup_s + scenario.measure_s
    lo_s = scenario.warmup_s
    engine = Engine(get_profile(scenario.profile))
    config = _config(scenario)
    loads = {t.name: t for t in scenario.tenants}
    names = config.names
    arrivals = sorted((t, n) for n, load in loads.items() for t in load.arrivals(end_s, rng))
    queues: dict[str, deque[_Req]] = {n: deque() for n in names}
    in_flight = dict.fromkeys(names, 0)
    live: dict[str, _Req] = {}
    ids = itertools.count()
    recent: dict[str, deque[tuple[float, float]]] = {n: deque() for n in names}

    def new_request(load: TenantLoad, at_s: float) -> _Req:
        rid = f"{load.name}-{next(ids)}"
        prompt = load.system_prompt_tokens + rng.randint(*load.prompt_tokens)
        return _Req(rid, load.name, at_s, prompt, load.output_tokens)

    for load in scenario.tenants:
        if load.kind == "closed":
            queues[load.name].extend(new_request(load, 0.0) for _ in range(load.outstanding))

    done: dict[str, list[float]] = {n: [] for n in names}
    waits: dict[str, list[float]] = {n: [] for n in names}
    tokens = dict.fromkeys(names, 0)
    moves = dict.fromkeys(names, 0)
    holds = ticks = 0
    kv_area = busy_s = 0.0
    timeline: list[tuple[float, dict[str, int]]] = []
    alloc: Allocation | None = None
    now, next_tick, ai = 0.0, 0.0, 0
    preempt_start = 0
    max_in_flight = 0

    def in_window(t: float) -> bool:
        return lo_s <= t < end_s

    while now < end_s:
        while ai < len(arrivals) and arrivals[ai][0] <= now:
            t_arr, name = arrivals[ai]
            queues[name].append(new_request(loads[name], t_arr))
            ai += 1
        if now >= next_tick:
            obs = {}
            for n in names:
                window = recent[n]
                while window and window[0][0] < now - P99_WINDOW_S:
                    window.popleft()
                lat = [x for _, x in window]
                obs[n] = TenantObservation(n, len(queues[n]), in_flight[n], now, _p99(lat) if lat else None)
            state = BudgetState(now, config, obs, alloc, ClusterObservation(engine.kv_cache_usage))
            alloc = policy.reallocate(state)
            if in_window(now):
                ticks += 1
                holds += alloc.is_hold
                for n in alloc.moved_to:
                    moves[n] += 1
                timeline.append((round(now - lo_s, 3), dict(alloc.caps)))
            if now < lo_s:
                preempt_start = engine.num_preemptions_total
            next_tick += scenario.tick_s
        assert alloc is not None
        admitted: list[_Req] = []
        for n in names:  # within its own cap and limit: always admissible
            q = queues[n]
            while q and in_flight[n] < min(alloc.caps[n], alloc.limits[n]):
                admitted.append(q.popleft())
                in_flight[n] += 1
        while True:  # into slots draining donors vacated (Allocation.admits), oldest head first
            heads = sorted((queues[n][0].arrival_s, n) for n in names if queues[n])
            pick = next((n for _, n in heads if (in_flight[n] < alloc.limits[n] if overcommit
                                                 else alloc.admits(n, in_flight))), None)
            if pick is None:
                break
            admitted.append(queues[pick].popleft())
            in_flight[pick] += 1
        max_in_flight = max(max_in_flight, sum(in_flight.values())) if now >= lo_s else max_in_flight
        for r in sorted(admitted, key=lambda r: (r.arrival_s, r.rid)):
            r.admitted_s = now
            live[r.rid] = r
            content = SyntheticContent(r.rid, f"{r.tenant}-system", loads[r.tenant].system_prompt_tokens)
            engine.add_request(EngineRequest(r.rid, content, r.prompt_tokens, r.output_tokens))
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
                    in_flight[r.tenant] -= 1
                    load = loads[r.tenant]
                    start = r.admitted_s if load.kind == "closed" else r.arrival_s
                    latency = now - start
                    recent[r.tenant].append((now, latency))
                    if in_window(now):
                        done[r.tenant].append(latency)
                        waits[r.tenant].append(r.admitted_s - r.arrival_s)
                        tokens[r.tenant] += f.output_tokens
                    if load.kind == "closed":
                        queues[r.tenant].append(new_request(load, now))
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
        wall_s=time.perf_counter() - started,
    )
