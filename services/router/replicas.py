"""The replica registry: configured and admin-added vLLM replicas, health probes, /metrics
scrapes and the per-replica circuit breaker.

Every ``health_interval_s`` each replica gets ``GET /health``; when it passes, ``GET
/metrics`` (vLLM names: ``vllm:cache_config_info`` -> KV capacity = num_gpu_blocks ×
block_size and the block size itself (``DEFAULT_BLOCK_SIZE`` until a scrape says it),
``vllm:num_requests_running/waiting``, ``vllm:kv_cache_usage_perc`` (older
``gpu_cache_usage_perc``), ``vllm:prefix_cache_hits/queries`` -> hit rate over the last
scrape interval) and, until known and then every 30 probes, ``GET /v1/models`` (the served
model names: only requests and sessions for one of them are placed on the replica). A refused
connection marks the replica down at once; timeouts and 5xx after two probes in a row.
Request failures reported by the proxy feed the breaker; an open breaker makes the replica
unhealthy until it has been open ``breaker_open_s`` and a probe passes.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from urllib.parse import urlsplit

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from services.common.aio import reraise_if_cancelling, stop_tasks, wait_event
from services.common.errors import AlreadyExists, InvalidArgument, NotFound
from services.common.vocabulary import DEFAULT_BLOCK_SIZE
from services.router.core.breaker import Breaker
from services.router.core.model import Replica
from services.router.upstream import Origin

MODELS_EVERY_PROBES = 30
PROBE_FAILURES_TO_DOWN = 2


@dataclass(frozen=True, slots=True)
class MetricsSample:
    kv_capacity_tokens: int = 0
    running: int = 0
    waiting: int = 0
    kv_cache_usage: float = 0.0
    prefix_hits: float = 0.0
    prefix_queries: float = 0.0
    #: ``block_size`` label of ``vllm:cache_config_info`` (0: not reported)
    block_size: int = 0


#: the only metric names the router reads; other lines are dropped before parsing
USED_METRICS = ("vllm:cache_config_info", "vllm:num_requests_running", "vllm:num_requests_waiting",
                "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "vllm:prefix_cache_hits",
                "vllm:prefix_cache_queries")


def parse_vllm_metrics(text: str) -> MetricsSample:
    """Sum the vLLM gauges/counters the router uses over all label sets (engines).

    Runs on the event loop once per replica and probe: only the sample lines of
    ``USED_METRICS`` reach prometheus_client's (pure Python, ~0.1 ms a line) parser, untyped,
    which names their samples as written, so a vLLM /metrics page of hundreds of histogram
    lines costs a few lines' parsing instead of blocking the loop for milliseconds."""
    kv = running = waiting = block = 0
    usage: list[float] = []
    hits = queries = 0.0
    wanted = "\n".join(line for line in text.splitlines() if line.startswith(USED_METRICS))
    for family in text_string_to_metric_families(wanted + "\n"):
        for s in family.samples:
            name = s.name
            if name == "vllm:cache_config_info":
                try:
                    size = int(s.labels.get("block_size", "0"))
                    kv += int(s.labels.get("num_gpu_blocks", "0")) * size
                except ValueError:
                    continue
                block = max(block, size)  # engines of one replica share the cache config
            elif name == "vllm:num_requests_running":
                running += int(s.value)
            elif name == "vllm:num_requests_waiting":
                waiting += int(s.value)
            elif name in ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"):
                usage.append(float(s.value))
            elif name in ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_hits"):
                hits += float(s.value)
            elif name in ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_queries"):
                queries += float(s.value)
    kv_usage = min(1.0, max(0.0, sum(usage) / len(usage))) if usage else 0.0
    return MetricsSample(kv, running, waiting, kv_usage, hits, queries, block)


def replica_id_for(url: str) -> str:
    parts = urlsplit(url)
    return parts.netloc


def check_url(url: str) -> str:
    """Normalised base URL; ``InvalidArgument`` when not http(s)://host[:port][/path]."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidArgument(f"replica URL must be http(s)://host[:port], got {url!r}")
    try:
        _ = parts.port
    except ValueError as exc:
        raise InvalidArgument(f"replica URL has a bad port: {url!r}") from exc
    if parts.query or parts.fragment:
        raise InvalidArgument(f"replica URL must not have a query or fragment: {url!r}")
    return f"{parts.scheme}://{parts.netloc}{parts.path.rstrip('/')}"


def parse_replica_spec(spec: str) -> tuple[str, str]:
    """``URL`` or ``ID=URL`` -> (id, url)."""
    rid, sep, url = spec.partition("=")
    if not sep or "://" in rid:
        url = check_url(spec)
        return replica_id_for(url), url
    if not rid.strip():
        raise InvalidArgument(f"empty replica id in {spec!r}")
    return rid.strip(), check_url(url)


@dataclass
class ReplicaEntry:
    id: str
    url: str
    configured_kv_tokens: int = 0
    breaker: Breaker = field(default_factory=Breaker)
    probe_ok: bool = False
    probe_failures: int = 0
    probes: int = 0
    draining: bool = False
    metrics: MetricsSample = field(default_factory=MetricsSample)
    prefix_hit_rate: float = 0.0
    models: tuple[str, ...] = ()
    model_cards: tuple[dict[str, object], ...] = ()
    #: the block size last scraped (kept when a later scrape fails to say it)
    block_size: int = DEFAULT_BLOCK_SIZE
    last_error: str = ""
    #: where requests go (parsed once from ``url``, which never changes for an entry)
    origin: Origin = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.origin = Origin.parse(self.url)

    def view(self) -> Replica:
        kv = self.metrics.kv_capacity_tokens or self.configured_kv_tokens  # scraped wins, as documented
        return Replica(
            id=self.id, url=self.url, kv_capacity_tokens=kv, healthy=self.probe_ok and not self.breaker.is_open,
            draining=self.draining, running=self.metrics.running, waiting=self.metrics.waiting,
            kv_cache_usage=self.metrics.kv_cache_usage, prefix_hit_rate=self.prefix_hit_rate, models=self.models,
            block_size=self.block_size,
        )


class ReplicaRegistry:
    """Owns replica entries; ``on_change(entry)`` pushes a new view into the router core."""

    def __init__(self, on_change: Callable[[ReplicaEntry], None], now: Callable[[], float], *,
                 interval_s: float, timeout_s: float, default_kv_tokens: int, breaker: Breaker) -> None:
        self.entries: dict[str, ReplicaEntry] = {}
        self._on_change = on_change
        self._now = now
        self._interval_s = interval_s
        self._timeout_s = timeout_s
        self._default_kv = default_kv_tokens
        self._breaker = breaker
        self._http: aiohttp.ClientSession | None = None
        self._task: asyncio.Task[None] | None = None
        self._kick = asyncio.Event()

    # ------------------------------------------------------------------ membership

    def add(self, rid: str, url: str, kv_tokens: int = 0) -> tuple[ReplicaEntry, bool]:
        """Add, or re-enable a draining replica with the same URL. Returns (entry, created)."""
        url = check_url(url)
        rid = rid or replica_id_for(url)
        if kv_tokens < 0:
            raise InvalidArgument("kv_capacity_tokens must be >= 0")
        entry = self.entries.get(rid)
        if entry is not None:
            if entry.url != url:
                raise AlreadyExists(f"replica {rid!r} is registered with URL {entry.url}")
            entry.draining = False
            if kv_tokens:
                entry.configured_kv_tokens = kv_tokens
            self._on_change(entry)
            self._kick.set()
            return entry, False
        entry = ReplicaEntry(rid, url, kv_tokens or self._default_kv, breaker=self._breaker)
        self.entries[rid] = entry
        self._on_change(entry)
        self._kick.set()
        return entry, True

    def drain(self, rid: str) -> ReplicaEntry:
        entry = self.entries.get(rid)
        if entry is None:
            raise NotFound(f"unknown replica {rid!r}")
        entry.draining = True
        self._on_change(entry)
        return entry

    # ------------------------------------------------------------------ request outcomes

    def report_failure(self, rid: str, reason: str) -> bool:
        """A request to ``rid`` failed at the connection level; True when it is now down."""
        entry = self.entries.get(rid)
        if entry is None:
            return False
        was_open = entry.breaker.is_open
        entry.breaker = entry.breaker.failure(self._now())
        entry.last_error = reason
        if entry.breaker.is_open and not was_open:
            self._on_change(entry)
        return entry.breaker.is_open

    def report_success(self, rid: str) -> None:
        entry = self.entries.get(rid)
        if entry is not None and entry.breaker.failures:
            entry.breaker = entry.breaker.success()

    # ------------------------------------------------------------------ probing

    async def start(self) -> None:
        timeout = aiohttp.ClientTimeout(total=self._timeout_s)
        self._http = aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=64))
        await self.probe_all()
        self._task = asyncio.create_task(self._loop(), name="router-replica-probes")

    async def stop(self) -> None:
        if self._task is not None:
            await stop_tasks([self._task])
        if self._http is not None:
            await self._http.close()

    async def _loop(self) -> None:
        while True:
            reraise_if_cancelling()
            await wait_event(self._kick, self._interval_s)
            self._kick.clear()
            await self.probe_all()

    async def probe_all(self) -> None:
        if self.entries:
            await asyncio.gather(*(self._probe(e) for e in list(self.entries.values())))

    async def _probe(self, e: ReplicaEntry) -> None:
        assert self._http is not None
        before = e.view()
        ok, definitive, error = True, False, ""
        try:
            async with self._http.get(f"{e.url}/health") as resp:
                await resp.read()
                if resp.status != 200:
                    ok, error = False, f"/health answered {resp.status}"
            if ok:
                async with self._http.get(f"{e.url}/metrics") as resp:
                    if resp.status == 200:
                        self._apply_metrics(e, parse_vllm_metrics(await resp.text()))
                if not e.models or e.probes % MODELS_EVERY_PROBES == 0:
                    async with self._http.get(f"{e.url}/v1/models") as resp:
                        if resp.status == 200:
                            data = await resp.json()
                            cards = data.get("data", []) if isinstance(data, dict) else []
                            e.model_cards = tuple(m for m in cards if isinstance(m, dict) and m.get("id"))
                            e.models = tuple(sorted(str(m["id"]) for m in e.model_cards))
        except aiohttp.ClientConnectorError as exc:
            ok, definitive, error = False, True, f"connect: {exc.os_error or exc}"
        except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
            reraise_if_cancelling()
            ok, error = False, f"{type(exc).__name__}: {exc}"
        e.probes += 1
        if ok:
            e.probe_ok, e.probe_failures = True, 0
            e.breaker = e.breaker.probe_ok(self._now())
        else:
            e.probe_failures += 1
            e.last_error = error
            if definitive or e.probe_failures >= PROBE_FAILURES_TO_DOWN:
                e.probe_ok = False
        if e.view() != before:
            self._on_change(e)

    def _apply_metrics(self, e: ReplicaEntry, m: MetricsSample) -> None:
        dq = m.prefix_queries - e.metrics.prefix_queries
        dh = m.prefix_hits - e.metrics.prefix_hits
        if dq > 0 and dh >= 0:
            e.prefix_hit_rate = min(1.0, dh / dq)
        elif m.prefix_queries > 0 and e.prefix_hit_rate == 0.0:
            e.prefix_hit_rate = min(1.0, m.prefix_hits / m.prefix_queries)
        if not math.isfinite(e.prefix_hit_rate):
            e.prefix_hit_rate = 0.0
        if m.block_size > 0:
            e.block_size = m.block_size
        e.metrics = replace(m)
