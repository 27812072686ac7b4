"""Router gauges for the operators' dashboard (deploy/grafana/tao.json), read at scrape time
from the core: each replica's observed prefix-cache hit rate (from its vLLM /metrics) and,
per tenant, requests in flight and held against the budget cap the router applies."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from services.router.core.state import RouterCore


class OpsCollector(Collector):
    def __init__(self, core: RouterCore) -> None:
        self._core = core

    def collect(self) -> Iterator[GaugeMetricFamily]:
        core = self._core
        hit = GaugeMetricFamily("tao_router_replica_prefix_hit_rate",
                                "Prefix-cache hit rate the replica reports (0-1).", labels=["replica"])
        for rid, r in sorted(core.replicas.items()):
            hit.add_metric([rid], min(1.0, max(0.0, r.prefix_hit_rate)))
        yield hit
        tenants = sorted(set(core.tenant_in_flight) | set(core.tenant_held) | set(core.caps or {}))
        in_flight = GaugeMetricFamily("tao_router_tenant_in_flight", "Requests in flight per tenant.",
                                      labels=["tenant"])
        held = GaugeMetricFamily("tao_router_tenant_held", "Requests held per tenant.", labels=["tenant"])
        cap = GaugeMetricFamily("tao_router_tenant_cap_slots",
                                "Budget cap per tenant as the router applies it (absent: unlimited).",
                                labels=["tenant"])
        for t in tenants:
            in_flight.add_metric([t], core.tenant_in_flight.get(t, 0))
            held.add_metric([t], core.tenant_held.get(t, 0))
            if core.caps is not None and t in core.caps:
                cap.add_metric([t], core.caps[t])
        yield in_flight
        yield held
        yield cap


def register(registry: CollectorRegistry, core: RouterCore) -> None:
    registry.register(OpsCollector(core))
