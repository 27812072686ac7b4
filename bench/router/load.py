"""Streaming load; per request the time to the first SSE event, the gaps between events and
the total. Chunks are counted on ``data:`` lines, not parsed, so the client stays cheap.

- closed loop (``run_phase``): ``concurrency`` workers, each its own session, each sending
  requests back to back: every process on the path is kept busy, and a slower path also
  lowers the offered load (and its own queueing);
- open loop (``run_open_phase``): Poisson arrivals at a fixed rate over a pool of warmed
  sessions; latency counts from each request's scheduled arrival, so a load generator that
  falls behind does not hide time (no coordinated omission). The same seed gives the direct
  and the routed phase the same arrival sequence."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp

PROMPT = "Inspect the failing test, find the root cause in the parser and propose a patch. " * 6


@dataclass
class Sample:
    ok: bool
    ttft_s: float = 0.0
    total_s: float = 0.0
    chunks: int = 0
    gaps_s: list[float] = field(default_factory=list)
    #: the router's x-tao-hold-ms (time held for admission), 0 without a router
    hold_ms: float = 0.0


@dataclass
class PhaseResult:
    samples: list[Sample]
    wall_s: float

    @property
    def ok(self) -> list[Sample]:
        return [s for s in self.samples if s.ok]

    @property
    def errors(self) -> int:
        return sum(1 for s in self.samples if not s.ok)

    @property
    def chunks(self) -> int:
        return sum(s.chunks for s in self.ok)


async def one_request(http: aiohttp.ClientSession, url: str, body: dict[str, object],
                      headers: dict[str, str], t0: float | None = None) -> Sample:
    """One request; latencies count from ``t0`` (perf_counter; default: now)."""
    t0 = time.perf_counter() if t0 is None else t0
    try:
        async with http.post(url, json=body, headers=headers) as resp:
            if resp.status != 200:
                await resp.read()
                return Sample(False)
            hold_ms = float(resp.headers.get("x-tao-hold-ms", 0.0))
            if not body.get("stream"):
                await resp.read()
                now = time.perf_counter()
                return Sample(True, now - t0, now - t0, 1, hold_ms=hold_ms)
            first = last = 0.0
            gaps: list[float] = []
            chunks = 0
            async for line in resp.content:
                if not line.startswith(b"data:"):
                    continue
                if line.startswith(b"data: [DONE]"):
                    break
                now = time.perf_counter()
                if chunks == 0:
                    first = now
                else:
                    gaps.append(now - last)
                last = now
                chunks += 1
            return Sample(chunks > 0, first - t0, time.perf_counter() - t0, chunks, gaps, hold_ms)
    except (TimeoutError, aiohttp.ClientError):
        return Sample(False)


async def run_phase(base_url: str, model: str, *, tag: str, concurrency: int, requests_per_worker: int,
                    max_tokens: int, stream: bool = True, warmup: int = 1,
                    on_start: Callable[[], None] | None = None) -> PhaseResult:
    """Every worker sends ``warmup`` unmeasured requests (session admission, prefix cache),
    then all start the measured requests together."""
    url = base_url + "/v1/chat/completions"
    body: dict[str, object] = {"model": model, "messages": [{"role": "user", "content": PROMPT}],
                               "max_tokens": max_tokens, "stream": stream, "ignore_eos": True}
    barrier = asyncio.Barrier(concurrency + 1)
    samples: list[Sample] = []
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:

        async def worker(i: int) -> None:
            headers = {"x-session-id": f"{tag}-{i}"}
            for _ in range(warmup):
                await one_request(http, url, body, headers)
            await barrier.wait()
            for _ in range(requests_per_worker):
                samples.append(await one_request(http, url, body, headers))

        tasks = [asyncio.create_task(worker(i)) for i in range(concurrency)]
        await barrier.wait()
        if on_start is not None:
            on_start()
        started = time.perf_counter()
        await asyncio.gather(*tasks)
        wall = time.perf_counter() - started
    return PhaseResult(samples, wall)


async def run_open_phase(base_url: str, model: str, *, tag: str, rate_per_s: float, requests: int, sessions: int,
                         max_tokens: int, seed: int = 1, on_start: Callable[[], None] | None = None) -> PhaseResult:
    """``requests`` arrivals, exponential inter-arrival times of mean ``1 / rate_per_s``, each
    on the next of ``sessions`` sessions (round robin; each session is warmed by one request
    first, so it is admitted and its prefix cached). ``wall_s`` runs from the first arrival
    to the last completion."""
    url = base_url + "/v1/chat/completions"
    body: dict[str, object] = {"model": model, "messages": [{"role": "user", "content": PROMPT}],
                               "max_tokens": max_tokens, "stream": True, "ignore_eos": True}
    headers = [{"x-session-id": f"{tag}-{i}"} for i in range(sessions)]
    rng = random.Random(seed)
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        await asyncio.gather(*(one_request(http, url, body, h) for h in headers))
        if on_start is not None:
            on_start()
        started = due = time.perf_counter()
        tasks = []
        for i in range(requests):
            due += rng.expovariate(rate_per_s)
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one_request(http, url, body, headers[i % sessions], t0=due)))
        samples = list(await asyncio.gather(*tasks))
        wall = time.perf_counter() - started
    return PhaseResult(samples, wall)
