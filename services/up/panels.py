"""The Grafana dashboard's panels (deploy/grafana/tao.json) as PNGs in the `tao up` report, so a
person can see them without Prometheus or Grafana.

``MetricsSampler`` scrapes every service's /metrics once per interval while the workload runs;
``write_panels`` computes each panel from those samples the way its PromQL does (gauges as
they are; histogram quantiles and means over the change between two samples) and draws it.
Times on the x axis are wall seconds since the run started.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from services.common.stats import histogram_quantile

Key = tuple[str, tuple[tuple[str, str], ...]]  # sample name, sorted labels


@dataclass
class Scrape:
    t_s: float
    values: dict[Key, float]


@dataclass
class MetricsSampler:
    urls: dict[str, str]
    interval_s: float = 2.0
    scrapes: list[Scrape] = field(default_factory=list)

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        start = loop.time()
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2.0)) as http:
            while True:
                values: dict[Key, float] = {}
                for url in self.urls.values():
                    with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError, OSError):
                        async with http.get(url) as resp:
                            values.update(parse(await resp.text()))
                self.scrapes.append(Scrape(loop.time() - start, values))
                await asyncio.sleep(self.interval_s)


def parse(text: str) -> dict[Key, float]:
    out: dict[Key, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = float(s.value)
    return out


def _series(scrapes: list[Scrape], name: str, by: str | None = None) -> dict[str, list[tuple[float, float]]]:
    """A gauge summed over every label but ``by``: label value -> [(t, value)]."""
    out: dict[str, list[tuple[float, float]]] = {}
    for sc in scrapes:
        sums: dict[str, float] = {}
        for (n, labels), v in sc.values.items():
            if n == name:
                key = dict(labels).get(by, "") if by else name
                sums[key] = sums.get(key, 0.0) + v
        for key, v in sums.items():
            out.setdefault(key, []).append((sc.t_s, v))
    return out


def _buckets(sc: Scrape, name: str) -> dict[float, float]:
    out: dict[float, float] = {}
    for (n, labels), v in sc.values.items():
        if n == f"{name}_bucket":
            le = float(dict(labels)["le"])
            out[le] = out.get(le, 0.0) + v
    return out


def _windowed(scrapes: list[Scrape], name: str, stat: Callable[[dict[float, float], float, float], float | None]
              ) -> list[tuple[float, float]]:
    """``stat`` of the observations between consecutive scrapes (bucket deltas, sum, count)."""
    out = []
    for prev, cur in zip(scrapes, scrapes[1:], strict=False):
        a, b = _buckets(prev, name), _buckets(cur, name)
        delta = {le: b[le] - a.get(le, 0.0) for le in b}
        s = _total(cur, f"{name}_sum") - _total(prev, f"{name}_sum")
        c = _total(cur, f"{name}_count") - _total(prev, f"{name}_count")
        v = stat(delta, s, c)
        if v is not None:
            out.append((cur.t_s, v))
    return out


def _total(sc: Scrape, name: str) -> float:
    return sum(v for (n, _), v in sc.values.items() if n == name)


def _q(q: float) -> Callable[[dict[float, float], float, float], float | None]:
    """``histogram_quantile(q, ...)`` (q in [0, 1], as PromQL writes it), None without observations."""

    def stat(buckets: dict[float, float], s: float, c: float) -> float | None:
        v = histogram_quantile(buckets.items(), q * 100.0)
        return None if c <= 0 or math.isnan(v) else v

    return stat


def _mean(buckets: dict[float, float], s: float, c: float) -> float | None:
    return s / c if c > 0 else None


@dataclass
class Panel:
    title: str
    unit: str
    lines: dict[str, list[tuple[float, float]]]


def panels(scrapes: list[Scrape]) -> list[Panel]:
    """The dashboard's panels computed from the scrapes (empty lines are dropped)."""
    def hist(name: str, unit: str, title: str, qs: Iterable[float] = (0.5, 0.99), mean: str = "") -> Panel:
        lines = {f"p{round(q * 100)}": _windowed(scrapes, name, _q(q)) for q in qs}
        if mean:
            lines[mean] = _windowed(scrapes, name, _mean)
        return Panel(title, unit, lines)

    phases = _series(scrapes, "tao_router_sessions", "phase")
    sessions = Panel("Sessions: admitted vs held", "sessions", {
        **phases, "held requests": _series(scrapes, "tao_router_held_requests").get("tao_router_held_requests", [])})
    caps = Panel("Caps and usage per tenant", "slots", {
        **{f"cap {t}": v for t, v in _series(scrapes, "tao_budget_cap_slots", "tenant").items()},
        **{f"in flight {t}": v for t, v in _series(scrapes, "tao_router_tenant_in_flight", "tenant").items()},
        **{f"held {t}": v for t, v in _series(scrapes, "tao_router_tenant_held", "tenant").items()}})
    hit = Panel("Prefix-cache hit rate per replica", "fraction",
                _series(scrapes, "tao_router_replica_prefix_hit_rate", "replica"))
    out = [
        sessions,
        hist("tao_router_hold_seconds", "s", "Hold time (p50 / p99 / mean)", mean="mean"),
        hist("tao_router_ttft_seconds", "s", "TTFT (p50 / p99)"),
        hist("tao_planner_solve_seconds", "s", "Plan solve time (p50 / p99)"),
        hist("tao_predictor_error_seconds", "s", "Prediction error (p50 / MAE)", qs=(0.5,), mean="MAE"),
        caps,
        hit,
    ]
    for p in out:
        p.lines = {k: v for k, v in p.lines.items() if v}
    return out


def write_panels(out_dir: Path, scrapes: list[Scrape], label: str) -> list[Path]:
    """One PNG per panel under ``out_dir`` (``panel-<label>-<n>-<slug>.png``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, p in enumerate(panels(scrapes), start=1):
        fig, ax = plt.subplots(figsize=(7, 3.2))
        for name, points in sorted(p.lines.items()):
            xs, ys = zip(*points, strict=True)
            ax.plot(xs, ys, label=name, linewidth=1.2)
        if not p.lines:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(f"{p.title} ({label})", fontsize=10)
        ax.set_xlabel("wall s since start")
        ax.set_ylabel(p.unit)
        if p.lines:
            ax.legend(fontsize=7, loc="upper left")
        ax.grid(alpha=0.3)
        slug = "".join(c if c.isalnum() else "-" for c in p.title.lower()).strip("-")[:40]
        path = out_dir / f"panel-{label}-{i}-{slug}.png"
        fig.tight_layout()
        fig.savefig(path, dpi=90)
        plt.close(fig)
        paths.append(path)
    return paths
