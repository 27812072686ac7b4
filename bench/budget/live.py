"""`tao bench budget --live`: a budget scenario on the running stack, with emulated replicas.

What runs is what ships: the stack of `tao up` (``services.up.stack``: Redis, the four services
as processes, ``tao vllm-sim`` replicas on the scenario's engine profile) with the router on a
per-request policy (``least_loaded``, as the simulated benchmark) so admission is the budget's
alone. Tenants are named by the router's dev header (``x-tao-tenant``); every request is a
single-turn session whose prompt length is set through the emulator's ``tao_synthetic`` field.
The budget service is configured with the scenario's tenants (floors, SLOs) over gRPC and its
policy switched with ``SetPolicy`` between runs; the stack is shared by the runs, which
start when the previous run's requests have all ended.

Requests go through the one load generator (``services.driver.chat.send_chat``, unary, the
answer decoded): a request is done when its answer is ``ok`` (a chat completion with usage), any
other outcome counts as an error. Latency is measured by the client on the run's model clock:
for open-loop tenants from sending, for the closed-loop tenant from admission (the response's
``x-tao-hold-ms`` is subtracted), as in the simulated benchmark. Times are model seconds (wall
seconds x ``time_scale``). The live window is short (``--live-seconds``, default 50 model
seconds after a 10 s warm-up) so the whole run stays within about three minutes; its figures
are noisier than the simulated ones, and on a loaded machine the emulator can fall behind real
time (reported as the achieved step rate).
"""

from __future__ import annotations

import asyncio
import math
import random
import statistics
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp

from bench.budget.workload import Scenario, TenantLoad
from services.common.stats import percentile
from services.driver.chat import CHAT_PATH, open_http, send_chat
from services.sim.engine import get_profile

LIVE_POLICIES = ("static", "dynamic")


@dataclass
class _Done:
    tenant: str
    end_s: float  # model seconds since the run started
    latency_s: float
    hold_s: float
    tokens: int
    sent_s: float = 0.0


@dataclass
class LiveRun:
    policy: str
    total_tokens_per_s: float
    per_tenant_tokens_per_s: dict[str, float]
    completed_requests: int
    per_tenant_p99_latency_s: dict[str, float]
    per_tenant_mean_wait_s: dict[str, float]
    mean_caps: dict[str, float]
    errors: int
    wall_s: float
    error_samples: list[str] = field(default_factory=list)
    #: the most the emulated replica's model time has trailed scaled wall time since it started
    #: (model seconds, ``tao_vllm_sim_max_lag_seconds``, read as the run ends; the policies run in
    #: turn on one replica, so a later run shows the worst of itself and those before): above
    #: ~1 s the emulator was short of CPU and throughput measured this machine, not the policy
    replica_lag_s: float = math.nan
    #: (model s, caps, limits) every 0.25 model s, and (tenant, sent model s, latency s, held s)
    #: of each tenant's requests at or above its p99: where a tail came from (diagnosis)
    timeline: list[tuple[float, dict[str, int], dict[str, int]]] = field(default_factory=list)
    tail: list[tuple[str, float, float, float]] = field(default_factory=list)


async def _replica_lag_s(http: Any, replicas: list[str]) -> float:
    """The largest ``tao_vllm_sim_max_lag_seconds`` of the replicas (NaN when none answers)."""
    worst = math.nan
    for url in replicas:
        try:
            async with http.get(url.rstrip("/") + "/metrics") as resp:
                text = await resp.text()
        except (TimeoutError, OSError, aiohttp.ClientError):
            continue
        for line in text.splitlines():
            if line.startswith("tao_vllm_sim_max_lag_seconds"):
                value = float(line.split()[-1])
                worst = value if math.isnan(worst) else max(worst, value)
    return worst


def _p99(values: list[float]) -> float:
    return percentile(values, 99, empty=math.nan)


async def _run_policy(scenario: Scenario, policy: str, router_url: str, budget_addr: str, model: str,
                      time_scale: float, seed: int, replicas: list[str]) -> LiveRun:
    import grpc

    from tao.budget.v1 import budget_pb2, budget_pb2_grpc

    rng = random.Random(seed)
    end_s = scenario.warmup_s + scenario.measure_s
    loads = {t.name: t for t in scenario.tenants}
    done: list[_Done] = []
    errors: list[str] = []
    caps_seen: list[dict[str, int]] = []
    timeline: list[tuple[float, dict[str, int], dict[str, int]]] = []
    stop = asyncio.Event()
    ids = iter(range(10**9))

    async with grpc.aio.insecure_channel(budget_addr) as channel:
        stub = budget_pb2_grpc.BudgetServiceStub(channel)
        await stub.ConfigureTenants(budget_pb2.ConfigureTenantsRequest(
            total_budget=scenario.total_slots,
            tenants=[budget_pb2.TenantConfig(name=t.name, floor=t.floor, weight=t.weight, p99_slo_s=t.p99_slo_s or 0.0)
                     for t in scenario.tenants]), timeout=5)
        await stub.SetPolicy(budget_pb2.SetPolicyRequest(policy=policy), timeout=5)
        async with open_http(600) as http:
            t0 = time.perf_counter()

            def now() -> float:
                return (time.perf_counter() - t0) * time_scale

            async def one(load: TenantLoad) -> None:
                rid = f"{policy}-{load.name}-{next(ids)}"
                prompt = load.system_prompt_tokens + rng.randint(*load.prompt_tokens)
                body = {"model": model, "messages": [{"role": "user", "content": rid}],
                        "max_tokens": load.output_tokens, "ignore_eos": True, "stream": False,
                        "tao_synthetic": {"session_id": rid, "prompt_tokens": prompt,
                                          "shared_prefix_id": f"{load.name}-system",
                                          "system_prompt_tokens": load.system_prompt_tokens}}
                sent = now()
                out = await send_chat(http, router_url + CHAT_PATH, body, {"x-tao-tenant": load.name}, t0=sent,
                                      clock=now)
                if not out.ok:
                    status = "" if out.status is None else f" HTTP {out.status}"
                    errors.append(f"{load.name} {out.kind}{status}: {out.detail}"[:160])
                    return
                hold_s = float(out.headers.get("x-tao-hold-ms", "0")) / 1000
                tokens = int((out.usage or {}).get("completion_tokens", 0))
                latency = out.total_s - (hold_s if load.kind == "closed" else 0.0)
                done.append(_Done(load.name, sent + out.total_s, latency, hold_s, tokens, sent))

            async def closed_worker(load: TenantLoad) -> None:
                while not stop.is_set():
                    await one(load)

            async def open_loop(load: TenantLoad) -> None:
                tasks = []
                for at in load.arrivals(end_s, rng):
                    delay = at / time_scale - (time.perf_counter() - t0)
                    if delay > 0:
                        await asyncio.sleep(delay)
                    tasks.append(asyncio.create_task(one(load)))
                await asyncio.gather(*tasks)

            async def watch_caps() -> None:
                while not stop.is_set():
                    with_caps = await stub.GetAllocation(budget_pb2.GetAllocationRequest(), timeout=5)
                    t = now()
                    caps, limits = dict(with_caps.allocation.caps), dict(with_caps.allocation.limits)
                    if t >= scenario.warmup_s:
                        caps_seen.append(caps)
                    timeline.append((round(t, 2), caps, limits))
                    await asyncio.sleep(0.25 / time_scale)

            workers = [asyncio.create_task(closed_worker(t)) for t in scenario.tenants if t.kind == "closed"
                       for _ in range(t.outstanding)]
            opens = [asyncio.create_task(open_loop(t)) for t in scenario.tenants if t.kind != "closed"]
            watcher = asyncio.create_task(watch_caps())
            await asyncio.sleep(end_s / time_scale)
            stop.set()
            lag = await _replica_lag_s(http, replicas)
            await asyncio.gather(*opens, *workers, watcher)
            wall = time.perf_counter() - t0

    lo, hi = scenario.warmup_s, end_s
    window = [d for d in done if lo <= d.end_s < hi]
    names = sorted(loads)
    span = scenario.measure_s
    tokens = {n: sum(d.tokens for d in window if d.tenant == n) for n in names}
    p99 = {n: _p99([d.latency_s for d in window if d.tenant == n]) for n in names}
    return LiveRun(
        policy=policy, total_tokens_per_s=sum(tokens.values()) / span,
        per_tenant_tokens_per_s={n: tokens[n] / span for n in names}, completed_requests=len(window),
        per_tenant_p99_latency_s=p99,
        per_tenant_mean_wait_s={n: statistics.fmean([d.hold_s for d in window if d.tenant == n] or [math.nan])
                                for n in names},
        mean_caps={n: statistics.fmean([c.get(n, 0) for c in caps_seen] or [math.nan]) for n in names},
        errors=len(errors), wall_s=wall, error_samples=errors[:5], replica_lag_s=lag, timeline=timeline,
        tail=[(d.tenant, round(d.sent_s, 2), round(d.latency_s, 3), round(d.hold_s, 3)) for d in window
              if d.latency_s >= p99[d.tenant]],
    )


def run_live(scenario: Scenario, live_seconds: float, time_scale: float = 1.0, seed: int = 101,
             log_dir: Path | None = None) -> dict[str, Any]:
    """Start the stack, run each policy of ``LIVE_POLICIES`` for ``live_seconds`` model seconds
    (after the scenario's warm-up), stop the stack. Returns results by policy."""
    from services.up.stack import Stack, StackConfig

    sc = replace(scenario, measure_s=live_seconds)
    tenants = tuple(t.name for t in sc.tenants)
    cfg = StackConfig(replicas=1, profile=sc.profile, policy="least_loaded", time_scale=time_scale,
                      total_budget=sc.total_slots, tenants=tenants, hold_timeout_s=600.0,
                      log_dir=log_dir or Path(tempfile.mkdtemp(prefix="tao-bench-budget-live-")))
    stack = Stack(cfg)
    results: dict[str, Any] = {"scenario": sc.name, "measure_s": sc.measure_s, "warmup_s": sc.warmup_s,
                               "time_scale": time_scale, "log_dir": str(cfg.log_dir), "policies": {}}
    started = time.perf_counter()
    try:
        addr = stack.start()
        model = get_profile(sc.profile).model_name
        for policy in LIVE_POLICIES:
            run = asyncio.run(_run_policy(sc, policy, addr.router_url, addr.budget, model, time_scale, seed,
                                          addr.replicas))
            results["policies"][policy] = run.__dict__
        results["failed_children"] = stack.failed()
    finally:
        stack.stop()
    results["wall_s"] = time.perf_counter() - started
    return results


def render_live(res: dict[str, Any]) -> list[str]:
    lines = [f"== live {res['scenario']}: the stack with 1 emulated replica, {res['measure_s']:g} s measured after "
             f"{res['warmup_s']:g} s warm-up (model seconds, time scale {res['time_scale']:g}), "
             f"wall {res['wall_s']:.0f} s, logs {res['log_dir']}"]
    lines.append(f"   {'policy':10} {'tok/s':>8} {'per tenant tok/s':>22} {'done':>6} {'p99 per tenant s':>20} "
                 f"{'mean wait per tenant s':>24} {'mean caps':>14} {'errors':>6} {'max lag s':>9}")
    for label, r in res["policies"].items():
        def fmt(m: dict[str, float], d: int = 2) -> str:
            return " ".join(f"{k}:{v:,.{d}f}" for k, v in m.items())
        lines.append(f"   {label:10} {r['total_tokens_per_s']:8,.0f} {fmt(r['per_tenant_tokens_per_s'], 0):>22} "
                     f"{r['completed_requests']:6d} {fmt(r['per_tenant_p99_latency_s']):>20} "
                     f"{fmt(r['per_tenant_mean_wait_s']):>24} {fmt(r['mean_caps'], 0):>14} {r['errors']:6d} "
                     f"{r.get('replica_lag_s', math.nan):9.2f}")
        for e in r["error_samples"]:
            lines.append(f"      error: {e}")
    pol = res["policies"]
    if "static" in pol and "dynamic" in pol and pol["static"]["total_tokens_per_s"] > 0:
        s, d = pol["static"], pol["dynamic"]
        per = ", ".join(f"{n} {100 * (d['per_tenant_p99_latency_s'][n] / v - 1):+.1f} %"
                        for n, v in s["per_tenant_p99_latency_s"].items() if v and not math.isnan(v))
        lines.append(f"   dynamic / static: throughput {100 * (d['total_tokens_per_s'] / s['total_tokens_per_s'] - 1):+.1f} %, "
                     f"p99 per tenant {per}")
    if res.get("failed_children"):
        lines.append(f"   children that died: {res['failed_children']}")
    return lines
