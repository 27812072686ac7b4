"""The router's Prometheus metrics (served on the HTTP gateway's /metrics and, when
``metrics_port`` is set, by the shared bootstrap)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from services.router.runtime import RouterRuntime

OVERHEAD_BUCKETS = (0.00005, 0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5)
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
#: holds: a paused session is held for up to ``plan_hold_timeout_s`` (30 min by default) or a
#: multiple of the longest tool call, so the buckets run from 1 ms to 4 hours
HOLD_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60,
                120, 300, 600, 1200, 1800, 3600, 7200, 14400)


class _StateCollector(Collector):
    def __init__(self, runtime: RouterRuntime) -> None:
        self._rt = runtime

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        core = self._rt.core
        phases = GaugeMetricFamily("tao_router_sessions", "Sessions by phase.", labels=["phase"])
        counts: dict[str, int] = {p: 0 for p in ("WAITING", "RUNNING", "ACTING", "PAUSED")}
        for s in core.sessions.values():
            counts[core.phase(s)] += 1
        for phase, n in counts.items():
            phases.add_metric([phase], n)
        yield phases
        yield GaugeMetricFamily("tao_router_held_requests", "Requests held at the router.", value=len(core.held))
        yield GaugeMetricFamily("tao_router_in_flight_requests", "Requests forwarded and not finished.",
                                value=len(core.in_flight))
        healthy = GaugeMetricFamily("tao_router_replica_healthy", "1 when the replica takes requests.",
                                    labels=["replica"])
        used = GaugeMetricFamily("tao_router_replica_used_tokens", "Footprint admitted on the replica.",
                                 labels=["replica"])
        cap = GaugeMetricFamily("tao_router_replica_capacity_tokens", "Admissible KV tokens.", labels=["replica"])
        for rid, r in sorted(core.replicas.items()):
            healthy.add_metric([rid], 1.0 if r.healthy and not r.draining else 0.0)
            used.add_metric([rid], core.used.get(rid, 0))
            cap.add_metric([rid], core.capacity(rid))
        yield healthy
        yield used
        yield cap
        yield GaugeMetricFamily("tao_router_planner_silent", "1 while the local fallback policy admits.",
                                value=1.0 if core.config.gating and self._rt.planner_silent() else 0.0)
        unplanned = CounterMetricFamily(
            "tao_router_unplanned_admissions", "Pool sessions the router core admitted without a plan: at "
            "their request's arrival when nothing contended (CoreConfig.fast_admit), over capacity after "
            "their hold limit, or forced after the force-resume bound.", labels=["reason"])
        unplanned.add_metric(["arrival"], core.fast_admits)
        unplanned.add_metric(["over_capacity"], core.over_capacity_admits)
        unplanned.add_metric(["force"], core.force_admits)
        yield unplanned
        fleet = self._rt.fleet
        if fleet is not None:  # fleet mode (fleet.py)
            yield GaugeMetricFamily("tao_router_fleet_member", "1 while this router's member lease is valid.",
                                    value=1.0 if fleet.member() else 0.0)
            yield GaugeMetricFamily("tao_router_fleet_owned_sessions", "Sessions this router owns.",
                                    value=len(fleet.owned))
            yield CounterMetricFamily("tao_router_fleet_forwarded", "Requests forwarded to their session's owner.",
                                      value=fleet.forwarded)
            yield CounterMetricFamily("tao_router_fleet_takeovers", "Sessions taken over from dead routers.",
                                      value=fleet.takeovers)
            slots = GaugeMetricFamily("tao_router_fleet_slots", "Admission slots of the tenant's budget cap "
                                      "this router holds.", labels=["tenant"])
            for tenant, n in sorted(fleet.allot.items()):
                slots.add_metric([tenant], n)
            yield slots


class RouterMetrics:
    def __init__(self, registry: CollectorRegistry, runtime: RouterRuntime) -> None:
        self.requests = Counter("tao_router_requests", "HTTP requests answered.", ["endpoint", "code"],
                                registry=registry)
        self.ttft = Histogram("tao_router_ttft_seconds", "Arrival to first byte sent to the client.",
                              buckets=LATENCY_BUCKETS, registry=registry)
        self.hold = Histogram("tao_router_hold_seconds", "Time requests were held before forwarding.",
                              buckets=HOLD_BUCKETS, registry=registry)
        self.overhead = Histogram(
            "tao_router_overhead_seconds",
            "Time a request spends in the router itself before its first byte reaches the client: "
            "parsing, auth, admission bookkeeping and forwarding, plus relaying the first upstream "
            "chunk; excludes time held for admission and the replica's own time.",
            buckets=OVERHEAD_BUCKETS, registry=registry)
        self.upstream_failures = Counter("tao_router_upstream_failures", "Connection-level replica failures.",
                                         ["replica"], registry=registry)
        self.plans = Counter("tao_router_plans_applied", "Plans applied, by source.", ["source"],
                             registry=registry)
        self.plan_age = Histogram(
            "tao_router_plan_age_seconds",
            "Planner plans: router-clock seconds (model seconds under a time scale) from the snapshot a "
            "plan was computed on to its application here; what plan revalidation has to absorb.",
            buckets=LATENCY_BUCKETS, registry=registry)
        self.plan_parts = Counter(
            "tao_router_plan_parts",
            "Planner plans' assignments and pauses by outcome once revalidated: admitted, paused, "
            "pause_deferred (marked RUNNING), pause_dropped_{not_needed,marked,resumed}, rejected.",
            ["outcome"], registry=registry)
        registry.register(_StateCollector(runtime))
        self._request_children: dict[tuple[str, int], Counter] = {}

    def count_request(self, endpoint: str, status: int) -> None:
        """``requests{endpoint, code}`` += 1, through a child bound once per label pair."""
        child = self._request_children.get((endpoint, status))
        if child is None:
            child = self._request_children[(endpoint, status)] = self.requests.labels(endpoint, str(status))
        child.inc()
