"""Turn driver results into the same metrics and JSON as `tao sim run`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from services.driver.driver import DriverResult, RequestResult, TraceDriver
from services.sim.cluster.metrics import RequestRecord, SessionOutcome, summarize
from services.sim.workload.trace import TraceSession

#: a request counts as a paused wait when its response headers took at least this long,
#: measured by the driver, in model seconds *and* in wall seconds (``PAUSE_MIN_WALL_S``). The
#: same measurement for every endpoint: a router that holds a paused program (TAO,
#: ThunderAgent) answers headers only when it forwards, vLLM and per-request routers at once.
#: The wall floor keeps the machine's scheduling noise (tens of ms on 2 loaded cores) out
#: whatever the time scale: with a model-time threshold alone (it was a 1 ms epsilon) the
#: faster the clock runs, the more noise counts as waits and dilutes the mean (issue 14 saw
#: 10.4 → 74.1 s from time scale 20 to 5 while the router's hold histogram stayed flat). A
#: real pause lasts at least another session's LLM call: seconds.
PAUSE_MIN_S = 1.0
PAUSE_MIN_WALL_S = 0.1


def pause_threshold_s(time_scale: float) -> float:
    """Model seconds a request must wait to count as paused at ``time_scale``."""
    return max(PAUSE_MIN_S, PAUSE_MIN_WALL_S * time_scale)


def wait_of(r: RequestResult) -> float:
    """Model seconds the request waited before being forwarded: the driver's own measurement
    to the response headers; the router's ``x-tao-hold-ms`` only for results without it."""
    if r.wait_s is not None:
        return r.wait_s
    return r.hold_s or 0.0


def to_records(result: DriverResult) -> tuple[list[RequestRecord], list[SessionOutcome]]:
    requests: list[RequestRecord] = []
    sessions: list[SessionOutcome] = []
    threshold = pause_threshold_s(result.time_scale)
    for s in result.sessions:
        if s.completed:
            sessions.append(SessionOutcome(s.session_id, s.started_at_s, s.ended_at_s))
        for r in s.requests:
            if r.error is not None or r.ttft_s is None:
                continue
            hold = wait_of(r)
            requests.append(RequestRecord(
                session_id=r.session_id, turn=r.turn, ready_s=r.sent_at_s, forwarded_s=r.sent_at_s + hold,
                first_token_s=r.sent_at_s + r.ttft_s, end_s=r.sent_at_s + r.latency_s,
                prompt_tokens=r.prompt_tokens, cached_tokens=r.cached_tokens, output_tokens=r.completion_tokens,
                replica="", paused_wait=hold >= threshold,
            ))
    return requests, sessions


@dataclass(frozen=True, slots=True)
class ReplicaCounters:
    """Counters summed over replicas: preemptions and busy seconds (model seconds spent
    executing engine steps; None when a replica does not export ``tao_vllm_sim_busy_seconds``,
    e.g. real vLLM, so decode tokens per busy second is then not reported)."""

    preemptions: int = 0
    busy_s: float | None = None

    def __sub__(self, before: ReplicaCounters) -> ReplicaCounters:
        busy = None if self.busy_s is None or before.busy_s is None else self.busy_s - before.busy_s
        return ReplicaCounters(self.preemptions - before.preemptions, busy)


async def scrape_counters(replica_urls: list[str]) -> ReplicaCounters:
    """``vllm:num_preemptions_total`` and ``tao_vllm_sim_busy_seconds_total`` summed over the
    replicas (unreachable ones count 0 preemptions and make the busy time unknown)."""
    preempt = 0.0
    busy: float | None = 0.0 if replica_urls else None
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as http:
        for url in replica_urls:
            try:
                async with http.get(f"{url}/metrics") as resp:
                    text = await resp.text()
            except (aiohttp.ClientError, TimeoutError):
                busy = None
                continue
            seen_busy = False
            for family in text_string_to_metric_families(text):
                if family.name in ("vllm:num_preemptions", "vllm:num_preemptions_total"):
                    preempt += sum(s.value for s in family.samples if s.name.endswith("_total"))
                elif family.name in ("tao_vllm_sim_busy_seconds", "tao_vllm_sim_busy_seconds_total"):
                    seen_busy = True
                    if busy is not None:
                        busy += sum(s.value for s in family.samples if s.name.endswith("_total"))
            if not seen_busy:
                busy = None
    return ReplicaCounters(int(preempt), busy)


async def scrape_preemptions(replica_urls: list[str]) -> int:
    """Sum of ``vllm:num_preemptions_total`` over replicas (0 for unreachable ones)."""
    return (await scrape_counters(replica_urls)).preemptions


def metrics_of(result: DriverResult, preemptions: int = 0, busy_s: float | None = None) -> dict[str, Any]:
    """The `tao sim run` metrics of a live run; ``busy_s``: the replicas' busy seconds during it."""
    requests, sessions = to_records(result)
    out: dict[str, Any] = dict(summarize(requests, sessions, preemptions, 0.0, busy_s))
    out["errors"] = result.errors
    out["retries_503"] = sum(r.retries for s in result.sessions for r in s.requests)
    out["error_samples"] = sorted({r.error[:120] for s in result.sessions for r in s.requests if r.error})[:5]
    out["requests"] = len(requests)
    # every request's wait before anything forwarded it (no threshold), for any endpoint
    out["mean_wait_all_s"] = (sum(r.forwarded_s - r.ready_s for r in requests) / len(requests)) if requests else 0.0
    out["wall_s"] = round(result.wall_s, 3)
    out["per_session"] = per_session(result)
    return out


def per_session(result: DriverResult) -> list[dict[str, Any]]:
    """Each session's task latency and how long its requests waited before anything forwarded
    them (in all, and its longest single wait), model seconds: which sessions a run starved,
    which a mean over sessions hides."""
    rows = []
    for s in result.sessions:
        waits = [wait_of(r) for r in s.requests if r.error is None]
        rows.append({"session_id": s.session_id, "completed": s.completed,
                     "latency_s": round(s.ended_at_s - s.started_at_s, 3), "requests": len(s.requests),
                     "errors": sum(r.error is not None for r in s.requests),
                     "wait_s": round(sum(waits), 3), "max_wait_s": round(max(waits, default=0.0), 3)})
    return rows


async def measure(driver: TraceDriver, sessions: list[TraceSession], replica_urls: list[str]) -> dict[str, Any]:
    """Play ``sessions`` through ``driver``; the `tao sim run` metrics, with the preemptions and
    busy time the replicas at ``replica_urls`` counted during the run."""
    before = await scrape_counters(replica_urls)
    result = await driver.run(sessions)
    delta = await scrape_counters(replica_urls) - before
    return metrics_of(result, delta.preemptions, delta.busy_s)
