"""The router's KV-event adapter: subscribes to every replica's vLLM KV-event publisher, keeps
the pure block index (``core/kv_index.py``) current, and turns it into ``kv_events`` cache
credit for sessions (docs/architecture.md#kv-events).

- **Subscriber** (one task per configured replica): a ZMQ SUB socket on the replica's
  ``endpoint`` (``[topic, seq, payload]``, schema ``services.common.kv_events``). On start, and
  whenever a batch arrives out of sequence, it asks the replica's replay ROUTER socket for the
  missing batches (vLLM's protocol: ``[b"", start seq]`` answered by ``[b"", seq, payload]``
  frames and the end marker seq -1) over a DEALER socket, with ``replay_timeout_s``. What a
  replay cannot supply is given up (``KVBlockIndex.resync``): the replica's credit falls back
  to the usage-derived estimate until it clears its cache.
- **Prompts**: after a session's request succeeds on a replica with events, the router asks
  that replica for the prompt's token ids (vLLM's render API, ``POST <path>/render``: the
  request body in, ``token_ids`` out) and keeps the chained content digests of its full
  blocks (``block_digests``), per session, replaced by each new request.
- **Refresh** (every ``kv_refresh_s``, wall): for each session not running a request, the
  number of its prompt's leading blocks each replica holds now (``PrefixTracker``: incremental,
  O(removals + sessions) per refresh), in tokens, goes to
  ``RouterCore.observe_kv_residency`` — only changes are written. A replica whose index is not
  synced gets no ``kv_events`` evidence (withdrawn if it had some).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import aiohttp
import orjson
import structlog
import zmq
import zmq.asyncio
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from services.common.aio import stop_tasks, within
from services.common.kv_events import (
    END_SEQ,
    KVEventBatch,
    KVEventDecodeError,
    KvEventSource,
    decode_batch,
    seq_bytes,
    seq_from_bytes,
)
from services.common.vocabulary import DEFAULT_BLOCK_SIZE
from services.router.core.kv_index import KVBlockIndex, PrefixTracker, block_digests
from services.router.core.state import RouterCore
from services.router.prompt_length import tokenize_request

MAX_PROMPTS = 100_000  # sessions whose prompt digests are kept (sessions that end are dropped sooner)


async def fetch_replay(ctx: zmq.asyncio.Context, endpoint: str, start: int,
                       timeout_s: float) -> list[tuple[int, KVEventBatch]] | None:
    """Every batch the replay socket still buffers from ``start`` on; None when it does not answer
    in time (or answers garbage)."""
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(endpoint)
        await sock.send_multipart((b"", seq_bytes(start)))
        out: list[tuple[int, KVEventBatch]] = []
        while True:
            frames = await within(sock.recv_multipart(), timeout_s)
            if len(frames) != 3:
                return None
            seq = seq_from_bytes(frames[1])
            if seq == END_SEQ:
                return out
            if seq < 0:
                return None
            out.append((seq, decode_batch(frames[2])))
    except (TimeoutError, KVEventDecodeError, zmq.ZMQError):
        return None
    finally:
        sock.close(linger=0)


class ReplicaSubscriber:
    """Follows one replica's KV events into the index."""

    def __init__(self, index: KVBlockIndex, replica: str, source: KvEventSource, ctx: zmq.asyncio.Context,
                 replay_timeout_s: float, log: Any) -> None:
        self.index = index
        self.replica = replica
        self.source = source
        self.ctx = ctx
        self.replay_timeout_s = replay_timeout_s
        self.log = log
        self.received = 0
        self.replays = 0
        self.bad = 0
        self.failures = 0

    async def run(self, retry_s: float = 1.0) -> None:
        """Follow the replica until cancelled; an unexpected error restarts the subscription
        after ``retry_s`` (the index is resynchronised by the replay at start)."""
        while True:
            try:
                await self._follow()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a bug or a broken socket must not end KV events for good
                self.log.error("kv event subscriber failed", replica=self.replica, error=repr(exc))
                self.failures += 1
                await asyncio.sleep(retry_s)

    async def _follow(self) -> None:
        sub = self.ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, self.source.topic.encode("utf-8"))
        sub.connect(self.source.endpoint)
        try:
            await self._recover(None)  # the history so far, if the replay socket still has it
            while True:
                frames = await sub.recv_multipart()
                if len(frames) != 3:
                    self.bad += 1
                    continue
                try:
                    seq = seq_from_bytes(frames[1])
                    if seq < 0:
                        raise KVEventDecodeError(f"negative sequence number {seq}")
                    batch = decode_batch(frames[2])
                except KVEventDecodeError as exc:
                    self.bad += 1
                    self.log.warning("bad kv event message", replica=self.replica, error=str(exc))
                    continue
                self.received += 1
                offer = self.index.offer(self.replica, seq, batch)
                if offer.outcome == "gap":
                    await self._recover((seq, batch))
        finally:
            sub.close(linger=0)

    async def _recover(self, held: tuple[int, KVEventBatch] | None) -> None:
        """Fill the gap before ``held`` (the live batch that revealed it; None at start) from the
        replay socket; give up what it cannot supply."""
        index, rid = self.index, self.replica
        start = index.expected(rid)
        batches = None
        if self.source.replay_endpoint is not None:
            self.replays += 1
            batches = await fetch_replay(self.ctx, self.source.replay_endpoint, start, self.replay_timeout_s)
        if held is None and batches == [] and start == 0:
            index.start_empty(rid)  # nothing published yet: an empty cache, known
        for seq, batch in batches or ():
            if index.offer(rid, seq, batch, live=False).outcome == "gap":
                self.log.warning("kv events lost: replay buffer moved on", replica=rid, wanted=start, first=seq)
                index.resync(rid, seq)
                index.offer(rid, seq, batch, live=False)
        if held is not None:
            seq, batch = held
            if index.offer(rid, seq, batch, live=False).outcome == "gap":
                self.log.warning("kv events lost: no replay", replica=rid, wanted=index.expected(rid), got=seq)
                index.resync(rid, seq)
                index.offer(rid, seq, batch, live=False)


class KvCredit:
    """The index, its subscribers, the sessions' prompt digests and the credit refresh loop."""

    def __init__(self, core: RouterCore, sources: dict[str, KvEventSource], *, now: Callable[[], float],
                 base_url: Callable[[str], str | None], headers: dict[str, str], wake: Callable[[], None],
                 refresh_s: float = 0.5, replay_timeout_s: float = 2.0, render_timeout_s: float = 5.0,
                 log: Any = None, credit: bool = True) -> None:
        self.core = core
        #: turn the index into sessions' ``kv_events`` credit; off: index, metrics and sync only,
        #: so no prompt is learned (no render round trip per request) and nothing is refreshed
        self.credit = credit
        self.sources = dict(sources)
        self.index = KVBlockIndex()
        self.now = now
        self.base_url = base_url
        self.headers = headers
        self.wake = wake
        self.refresh_s = refresh_s
        self.replay_timeout_s = replay_timeout_s
        self.render_timeout_s = render_timeout_s
        self.log = log or structlog.get_logger("router.kv_events")
        #: session -> block size of its prompt's digests (the digests live in ``tracker``)
        self.prompts: dict[str, int] = {}
        self.tracker = PrefixTracker(self.index)
        self.subscribers: dict[str, ReplicaSubscriber] = {}
        self.renders = 0
        self.render_failures = 0
        self._ctx: zmq.asyncio.Context | None = None
        self._http: aiohttp.ClientSession | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._pending: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._ctx = zmq.asyncio.Context()
        self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.render_timeout_s))
        for rid, src in self.sources.items():
            sub = ReplicaSubscriber(self.index, rid, src, self._ctx, self.replay_timeout_s, self.log)
            self.subscribers[rid] = sub
            self._tasks.append(asyncio.create_task(sub.run(), name=f"router-kv-events-{rid}"))
        if self.credit:
            self._tasks.append(asyncio.create_task(self._refresh_loop(), name="router-kv-credit"))

    async def stop(self) -> None:
        await stop_tasks([*self._tasks, *self._pending])
        self._tasks.clear()
        if self._http is not None:
            await self._http.close()
        if self._ctx is not None:
            self._ctx.destroy(linger=0)

    # ------------------------------------------------------------------ prompts

    def learn(self, session_id: str, replica: str, path: str, body: bytes) -> None:
        """A request of ``session_id`` succeeded on ``replica``: learn its prompt's blocks (background;
        ``replica`` renders the prompt, the digests are matched on every replica with events)."""
        if self._http is None or not self.credit:
            return
        task = asyncio.create_task(self._learn(session_id, replica, path, body), name="router-kv-render")
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _learn(self, session_id: str, replica: str, path: str, body: bytes) -> None:
        ids = await self.render(replica, path, body)
        if ids is None:
            self.render_failures += 1
            return
        self.renders += 1
        sizes = [r.block_size for r in self.index.replicas.values() if r.block_size > 0]
        # until a replica's events say its block size: the one its /metrics reports
        # (vllm:cache_config_info, ``Replica.block_size``; vLLM's default 16 while unknown)
        scraped = self.core.replicas.get(replica)
        bs = sizes[0] if sizes else (scraped.block_size if scraped is not None else DEFAULT_BLOCK_SIZE)
        if session_id not in self.prompts and len(self.prompts) >= MAX_PROMPTS:
            oldest = next(iter(self.prompts))
            del self.prompts[oldest]
            self.tracker.drop(oldest)
        self.prompts[session_id] = bs
        self.tracker.set_chain(session_id, block_digests(ids, bs))

    async def render(self, replica: str, path: str, body: bytes) -> list[int] | None:
        """The prompt token ids of ``body`` as ``replica`` tokenises it: vLLM's render API
        (``vllm/entrypoints/serve/render/api_router.py``: ``POST <path>/render`` -> ``token_ids``),
        else, for a vLLM without it (404/405), ``POST /tokenize`` with the request's messages or
        prompt (-> ``tokens``)."""
        base = self.base_url(replica)
        if base is None or self._http is None:
            return None
        status, data = await self._post_json(f"{base}{path}/render", body)
        if status in (404, 405):
            tok = tokenize_request(body, path.endswith("/chat/completions"))
            if tok is None:
                return None
            status, data = await self._post_json(f"{base}/tokenize", orjson.dumps(tok))
            data = {"token_ids": data.get("tokens")} if isinstance(data, dict) else None
        if status != 200:
            return None
        if isinstance(data, list):  # /v1/completions/render answers one GenerateRequest per prompt
            data = data[0] if data else None
        ids = data.get("token_ids") if isinstance(data, dict) else None
        if not isinstance(ids, list) or not all(isinstance(t, int) for t in ids):
            return None
        return ids

    async def _post_json(self, url: str, body: bytes) -> tuple[int, Any]:
        assert self._http is not None
        try:
            async with self._http.post(url, data=body, headers=self.headers) as resp:
                raw = await resp.read()
                return resp.status, (orjson.loads(raw) if resp.status == 200 else None)
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return 0, None

    # ------------------------------------------------------------------ credit

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(self.refresh_s)
            if self.refresh():
                self.wake()

    def refresh(self) -> int:
        """Bring every idle session's ``kv_events`` evidence up to date; the number changed."""
        now = self.now()
        core, index, tracker = self.core, self.index, self.tracker
        tracker.sync()
        changed = 0
        for sid in list(self.prompts):
            s = core.sessions.get(sid)
            if s is None:
                del self.prompts[sid]
                tracker.drop(sid)
                continue
            if s.in_flight > 0:
                continue  # its blocks are pinned by the running request; refreshed when it ends
            bs = self.prompts[sid]
            for rid in self.sources:
                blocks = tracker.matched(sid, rid)
                rb = index.replicas.get(rid)
                if blocks is not None and rb is not None and rb.block_size not in (0, bs):
                    blocks = None  # another block size: the digests do not apply
                tokens = None if blocks is None else blocks * bs
                if core.observe_kv_residency(now, sid, rid, tokens):
                    changed += 1
        return changed


class KvEventsCollector(Collector):
    """Prometheus view of the KV-event subscription (registered by the router runtime)."""

    def __init__(self, kv: KvCredit) -> None:
        self._kv = kv

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        kv = self._kv
        synced = GaugeMetricFamily("tao_router_kv_events_synced",
                                   "1 while the replica's KV blocks are known from its events.", labels=["replica"])
        batches = CounterMetricFamily("tao_router_kv_event_batches", "KV-event batches applied.", labels=["replica"])
        gaps = CounterMetricFamily("tao_router_kv_event_gaps", "Sequence gaps seen (each one replayed).",
                                   labels=["replica"])
        bad = CounterMetricFamily("tao_router_kv_event_bad_messages", "Malformed KV-event messages skipped.",
                                  labels=["replica"])
        for rid in sorted(kv.sources):
            rb = kv.index.replicas.get(rid)
            sub = kv.subscribers.get(rid)
            synced.add_metric([rid], 1.0 if rb is not None and rb.synced else 0.0)
            batches.add_metric([rid], rb.batches if rb is not None else 0)
            gaps.add_metric([rid], rb.gaps if rb is not None else 0)
            bad.add_metric([rid], sub.bad if sub is not None else 0)
        yield synced
        yield batches
        yield gaps
        yield bad
        yield GaugeMetricFamily("tao_router_kv_prompts", "Sessions whose prompt blocks the router knows.",
                                value=len(kv.prompts))
        renders = CounterMetricFamily("tao_router_kv_prompt_renders", "Prompt token-id lookups, by result.",
                                      labels=["result"])
        renders.add_metric(["ok"], kv.renders)
        renders.add_metric(["failed"], kv.render_failures)
        yield renders

