"""Turn driver results into the same metrics and JSON as `tao sim run`."""

from __future__ import annotations

from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from bench.e2e.driver import DriverResult, TraceDriver
from sim.cluster.metrics import RequestRecord, SessionRecord, summarize
from sim.workload.trace import Session

#: a request held at the router longer than this counts as a paused wait
HOLD_EPSILON_S = 1e-3


def to_records(result: DriverResult) -> tuple[list[RequestRecord], list[SessionRecord]]:
    requests: list[RequestRecord] = []
    sessions: list[SessionRecord] = []
    for s in result.sessions:
        if s.completed:
            sessions.append(SessionRecord(s.session_id, s.started_at_s, s.ended_at_s))
        for r in s.requests:
            if r.error is not None or r.ttft_s is None:
                continue
            hold = r.hold_s or 0.0
            requests.append(RequestRecord(
                session_id=r.session_id, turn=r.turn, ready_s=r.sent_at_s, forwarded_s=r.sent_at_s + hold,
                first_token_s=r.sent_at_s + r.ttft_s, end_s=r.sent_at_s + r.latency_s,
                prompt_tokens=r.prompt_tokens, cached_tokens=r.cached_tokens, output_tokens=r.completion_tokens,
                replica="", paused_wait=hold > HOLD_EPSILON_S,
            ))
    return requests, sessions


async def scrape_preemptions(replica_urls: list[str]) -> int:
    """Sum of ``vllm:num_preemptions_total`` over replicas (0 for unreachable ones)."""
    total = 0.0
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as http:
        for url in replica_urls:
            try:
                async with http.get(f"{url}/metrics") as resp:
                    text = await resp.text()
            except (aiohttp.ClientError, TimeoutError):
                continue
            for family in text_string_to_metric_families(text):
                if family.name in ("vllm:num_preemptions", "vllm:num_preemptions_total"):
                    total += sum(s.value for s in family.samples if s.name.endswith("_total"))
    return int(total)


def metrics_of(result: DriverResult, preemptions: int = 0) -> dict[str, Any]:
    requests, sessions = to_records(result)
    out: dict[str, Any] = dict(summarize(requests, sessions, preemptions, 0.0))
    out["errors"] = result.errors
    out["retries_503"] = sum(r.retries for s in result.sessions for r in s.requests)
    out["error_samples"] = sorted({r.error[:120] for s in result.sessions for r in s.requests if r.error})[:5]
    out["requests"] = len(requests)
    out["wall_s"] = round(result.wall_s, 3)
    return out


async def measure(driver: TraceDriver, sessions: list[Session], replica_urls: list[str]) -> dict[str, Any]:
    """Play ``sessions`` through ``driver``; the `tao sim run` metrics, with the preemptions the
    replicas at ``replica_urls`` counted during the run."""
    before = await scrape_preemptions(replica_urls)
    result = await driver.run(sessions)
    return metrics_of(result, await scrape_preemptions(replica_urls) - before)
