"""Per-request and per-session records, and the metrics `tao sim run` / `tao bench e2e` report.

Definitions (the same for the simulator and the live driver):
- task latency: session start (a worker slot picks the task up) to its last output token;
- TTFT: from the moment the client sends the request (arrival, or the tool's return) to
  the first output token, so router hold time counts — what an agent harness observes;
  ``mean_ttft_after_tool_s`` restricts to requests that follow a tool (turn > 0);
- decode throughput, two figures:
  ``decode_tok_s_makespan`` = all output tokens / makespan (last end - first start): what the
  cluster delivered over the run, idle gaps included;
  ``decode_tok_s_busy`` = all output tokens / Σ over replicas of the seconds spent executing
  engine steps (vLLM's generation throughput per busy engine-second); the simulator sums the
  engine model's step durations, live runs the replicas' ``tao_vllm_sim_busy_seconds`` counter
  (None when the replicas do not report it, e.g. real vLLM);
- prefix hit rate: sum(cached_tokens) / sum(prompt_tokens) (vLLM's prefix_cache_hits/queries);
- pause wait: for requests whose session was paused (admitted before, not admitted when the
  request became ready), the time held at the router before being forwarded; averaged over
  those requests (0 when none was held);
- planner time share: wall-clock seconds spent in ``Policy.plan`` / simulated makespan.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from services.common.stats import percentile

METRIC_KEYS: tuple[str, ...] = (
    "mean_task_latency_s",
    "p90_task_latency_s",
    "mean_ttft_s",
    "mean_ttft_after_tool_s",
    "decode_tok_s_makespan",
    "decode_tok_s_busy",
    "prefix_hit_rate",
    "mean_pause_wait_s",
    "preemptions",
    "planner_time_share",
    "completed_sessions",
)

# Which direction is better, for the delta tables ("lower" or "higher").
BETTER: dict[str, str] = {
    "mean_task_latency_s": "lower",
    "p90_task_latency_s": "lower",
    "mean_ttft_s": "lower",
    "mean_ttft_after_tool_s": "lower",
    "decode_tok_s_makespan": "higher",
    "decode_tok_s_busy": "higher",
    "prefix_hit_rate": "higher",
    "latency_over_lower_bound": "lower",
    "latency_over_capacity_bound": "lower",
    "busy_over_work_bound": "lower",
    "mean_pause_wait_s": "lower",
    "preemptions": "lower",
}


@dataclass(frozen=True, slots=True)
class RequestRecord:
    session_id: str
    turn: int
    ready_s: float  # the client sent it (arrival or tool return)
    forwarded_s: float  # left the router for a replica
    first_token_s: float
    end_s: float
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    replica: str
    paused_wait: bool  # the session was paused when the request became ready
    after_pause: bool = False  # the session was paused (and re-admitted) since its previous request


@dataclass(frozen=True, slots=True)
class SessionOutcome:
    session_id: str
    start_s: float
    end_s: float


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def summarize(
    requests: Sequence[RequestRecord],
    sessions: Sequence[SessionOutcome],
    preemptions: int,
    planner_wall_s: float,
    busy_s: float | None = None,
) -> dict[str, float | int | None]:
    """The per-policy metrics dict (exactly ``METRIC_KEYS``); ``busy_s``: seconds the replicas
    spent executing steps, summed (None: unknown, ``decode_tok_s_busy`` is None)."""
    latencies = [s.end_s - s.start_s for s in sessions]
    ttfts = [r.first_token_s - r.ready_s for r in requests]
    ttfts_tool = [r.first_token_s - r.ready_s for r in requests if r.turn > 0]
    waits = [r.forwarded_s - r.ready_s for r in requests if r.paused_wait]
    prompt = sum(r.prompt_tokens for r in requests)
    cached = sum(r.cached_tokens for r in requests)
    output = sum(r.output_tokens for r in requests)
    makespan = makespan_s(sessions)
    return {
        "mean_task_latency_s": _mean(latencies),
        "p90_task_latency_s": percentile(latencies, 90),
        "mean_ttft_s": _mean(ttfts),
        "mean_ttft_after_tool_s": _mean(ttfts_tool),
        "decode_tok_s_makespan": output / makespan if makespan > 0 else 0.0,
        "decode_tok_s_busy": None if busy_s is None else (output / busy_s if busy_s > 0 else 0.0),
        "prefix_hit_rate": cached / prompt if prompt else 0.0,
        "mean_pause_wait_s": _mean(waits),
        "preemptions": int(preemptions),
        "planner_time_share": planner_wall_s / makespan if makespan > 0 else 0.0,
        "completed_sessions": len(sessions),
    }


def makespan_s(sessions: Sequence[SessionOutcome]) -> float:
    """First session start to last session end (0 without sessions)."""
    if not sessions:
        return 0.0
    return max(s.end_s for s in sessions) - min(s.start_s for s in sessions)


LEGACY_KEYS: dict[str, str] = {"decode_tokens_per_s": "decode_tok_s_makespan"}
"""Old metric names -> current ones (results files written before the rename)."""


def upgrade_metrics(metrics: dict[str, Any]) -> dict[str, Any]:
    """A metrics dict read from an older file, with current key names (in place, returned):
    ``decode_tokens_per_s`` was output tokens / makespan; the busy figure is then unknown."""
    for old, new in LEGACY_KEYS.items():
        if old in metrics and new not in metrics:
            metrics[new] = metrics.pop(old)
    metrics.setdefault("decode_tok_s_busy", None)
    return metrics


@dataclass(frozen=True, slots=True)
class TimeSeries:
    """Binned series for the plots: decode tokens/s and prefix hit rate per bin."""

    bin_s: float
    t_s: tuple[float, ...]
    decode_tokens_per_s: tuple[float, ...]
    prefix_hit_rate: tuple[float, ...]


def time_series(requests: Sequence[RequestRecord], bin_s: float = 10.0) -> TimeSeries:
    """Output tokens are spread evenly over each request's decode span (first token to end);
    hit rate is attributed to the bin where the request was forwarded."""
    if not requests:
        return TimeSeries(bin_s, (), (), ())
    t0 = min(r.ready_s for r in requests)
    t1 = max(r.end_s for r in requests)
    n = max(1, math.ceil((t1 - t0) / bin_s))
    out = [0.0] * n
    prompt = [0] * n
    cached = [0] * n
    for r in requests:
        a, b = r.first_token_s - t0, r.end_s - t0
        span = b - a
        if span <= 0:
            out[min(n - 1, int(a // bin_s))] += r.output_tokens
        else:
            rate = r.output_tokens / span
            k = int(a // bin_s)
            while k < n and k * bin_s < b:
                lo, hi = max(a, k * bin_s), min(b, (k + 1) * bin_s)
                if hi > lo:
                    out[k] += rate * (hi - lo)
                k += 1
        kf = min(n - 1, int((r.forwarded_s - t0) // bin_s))
        prompt[kf] += r.prompt_tokens
        cached[kf] += r.cached_tokens
    return TimeSeries(
        bin_s,
        tuple(t0 + (k + 0.5) * bin_s for k in range(n)),
        tuple(v / bin_s for v in out),
        tuple((c / p) if p else float("nan") for c, p in zip(cached, prompt, strict=True)),
    )
