"""Streaming load; per request the time to the first SSE event, the gaps between events and
the total. Requests go through the one load generator's ``services.driver.chat.send_chat``
with ``parse=False``: chunks are counted on ``data:`` lines, not parsed, so the client stays
cheap. A request counts ok when it ends ``ok`` there (a stream reached ``[DONE]`` with content
and no error event).

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

from services.driver.chat import CHAT_PATH, open_http, send_chat

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
    out = await send_chat(http, url, body, headers, parse=False, t0=t0)
    if not out.ok:
        return Sample(False)
    assert out.ttft_s is not None  # an ok answer has its first event
    return Sample(True, out.ttft_s, out.total_s, out.chunks, out.gaps_s, float(out.headers.get("x-tao-hold-ms", 0.0)))


async def run_phase(base_url: str, model: str, *, tag: str, concurrency: int, requests_per_worker: int,
                    max_tokens: int, stream: bool = True, warmup: int = 1,
                    on_start: Callable[[], None] | None = None) -> PhaseResult:
    """Every worker sends ``warmup`` unmeasured requests (session admission, prefix cache),
    then all start the measured requests together."""
    url = base_url + CHAT_PATH
    body: dict[str, object] = {"model": model, "messages": [{"role": "user", "content": PROMPT}],
                               "max_tokens": max_tokens, "stream": stream, "ignore_eos": True}
    barrier = asyncio.Barrier(concurrency + 1)
    samples: list[Sample] = []
    async with open_http(600) as http:

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
    url = base_url + CHAT_PATH
    body: dict[str, object] = {"model": model, "messages": [{"role": "user", "content": PROMPT}],
                               "max_tokens": max_tokens, "stream": True, "ignore_eos": True}
    headers = [{"x-session-id": f"{tag}-{i}"} for i in range(sessions)]
    rng = random.Random(seed)
    async with open_http(600) as http:
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
