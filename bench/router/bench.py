"""`python -m bench.router [--quick]`: what the router adds on top of going straight to the
replica, measured in the same run against the same emulated replica (`tao vllm-sim`).

For 1, 64 and 256 concurrent streams (closed loop, one session per stream, sticky), the
direct and the routed phases alternate; per phase: TTFT p50/p99, inter-chunk p99,
requests/s and chunks/s; for the routed phase the router process's CPU time per streamed
chunk (= token: the emulator sends one token per chunk). Added latency = routed − direct at
the same percentile. A last phase drives 256 non-streaming 1-token requests to measure the
requests/s one router process sustains, with its CPU utilisation (a router below 100 % CPU
is not the bottleneck; ``rate / utilisation`` is the projected ceiling of one process).
Every process (load generator, router, replica, Redis) shares this machine's cores, which
the header records (with the load average: other work on the machine shows up as latency).

"own" is the router's own time per request from its ``tao_router_overhead_seconds``
histogram (bucket-interpolated): from handler entry to the upstream call, minus any hold,
plus relaying the first chunk. It includes waiting for the router's event loop, so under a
closed loop, where the replica finishes a batch of streams in one step and they all come
back at once, its p99 is the time the router needs to forward a whole burst.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time
import urllib.request
from dataclasses import dataclass

from bench.router.load import PhaseResult, percentile, run_phase
from bench.router.procs import Proc, cpu_seconds, start_replica, start_router
from services.common.testing import RedisServer, find_redis_binary

TARGET_P50_MS, TARGET_P99_MS = 2.0, 10.0


def overhead_buckets(router_url: str) -> list[tuple[float, float]]:
    """Cumulative (le, count) of the router's ``tao_router_overhead_seconds`` histogram."""
    with urllib.request.urlopen(router_url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out = []
    for line in text.splitlines():
        if line.startswith("tao_router_overhead_seconds_bucket{"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            out.append((float("inf") if le == "+Inf" else float(le), float(line.rsplit(" ", 1)[1])))
    return out


def bucket_quantile(before: list[tuple[float, float]], after: list[tuple[float, float]], q: float) -> float:
    """Quantile (ms) of the observations between two scrapes, interpolated within buckets."""
    deltas = [(le, a - b) for (le, a), (_, b) in zip(after, before, strict=True)]
    total = deltas[-1][1] if deltas else 0.0
    if total <= 0:
        return float("nan")
    rank = q / 100.0 * total
    lo_edge, lo_count = 0.0, 0.0
    for le, count in deltas:
        if count >= rank:
            if le == float("inf"):
                return lo_edge * 1000
            span = count - lo_count
            frac = (rank - lo_count) / span if span else 1.0
            return (lo_edge + (le - lo_edge) * frac) * 1000
        lo_edge, lo_count = le, count
    return float("nan")


@dataclass
class Row:
    streams: int
    path: str
    result: PhaseResult
    cpu_s: float = 0.0
    own_p50_ms: float = float("nan")
    own_p99_ms: float = float("nan")

    def stats(self) -> dict[str, float]:
        ok = self.result.ok
        ttft = [s.ttft_s * 1000 for s in ok]
        gaps = [g * 1000 for s in ok for g in s.gaps_s]
        wall = self.result.wall_s
        chunks = self.result.chunks
        return {
            "requests": len(ok), "errors": self.result.errors,
            "ttft_p50_ms": percentile(ttft, 50), "ttft_p99_ms": percentile(ttft, 99),
            "gap_p99_ms": percentile(gaps, 99), "req_per_s": len(ok) / wall if wall else 0.0,
            "chunks_per_s": chunks / wall if wall else 0.0,
            "cpu_us_per_chunk": self.cpu_s / chunks * 1e6 if chunks and self.cpu_s else float("nan"),
            "router_cpu_util": self.cpu_s / wall if wall and self.cpu_s else float("nan"),
            "router_own_p50_ms": self.own_p50_ms, "router_own_p99_ms": self.own_p99_ms,
        }


def _model(url: str) -> str:
    with urllib.request.urlopen(url + "/v1/models", timeout=10) as resp:
        return str(json.load(resp)["data"][0]["id"])


async def _phase(base: str, model: str, tag: str, streams: int, per_worker: int, tokens: int,
                 router: Proc | None, stream: bool = True) -> Row:
    """One closed-loop phase; the router's CPU seconds and own-time histogram count from the
    end of the warm-up."""
    start_cpu = [0.0]
    start_hist: list[list[tuple[float, float]]] = [[]]

    def on_start() -> None:
        if router is not None:
            start_cpu[0] = cpu_seconds(router.pid)
            start_hist[0] = overhead_buckets(router.url)

    result = await run_phase(base, model, tag=tag, concurrency=streams, requests_per_worker=per_worker,
                             max_tokens=tokens, stream=stream, on_start=on_start)
    row = Row(streams, "router" if router else "direct", result)
    if router is not None:
        row.cpu_s = cpu_seconds(router.pid) - start_cpu[0]
        end_hist = overhead_buckets(router.url)
        row.own_p50_ms = bucket_quantile(start_hist[0], end_hist, 50)
        row.own_p99_ms = bucket_quantile(start_hist[0], end_hist, 99)
    return row


def _fmt(v: float, digits: int = 2) -> str:
    return "   n/a" if v != v else f"{v:.{digits}f}"


async def run(args: argparse.Namespace) -> dict[str, object]:
    levels = [int(x) for x in args.levels.split(",")]

    def per_worker(streams: int) -> int:
        if args.requests_per_stream:
            return int(args.requests_per_stream)
        if streams == 1:  # requests per level and round
            return 40 if args.quick else 150
        return max(2, (200 if args.quick else 600) // streams)

    rounds = 1 if args.quick else 2
    binary = find_redis_binary()
    if binary is None:
        raise SystemExit("bench.router needs redis-server (apt) or the 'embedded' extra")
    redis = RedisServer(binary)
    redis.start()
    replica = start_replica(args.profile, args.time_scale)
    router = start_router(redis.url, replica.url, args.policy)
    rows: list[Row] = []
    try:
        model = _model(replica.url)
        await asyncio.sleep(1.0)  # first health probe and /metrics scrape
        for streams in levels:
            for r in range(rounds):
                for path, base in (("direct", replica.url), ("router", router.url)):
                    proc = router if path == "router" else None
                    rows.append(await _phase(base, model, f"{path}-{streams}-{r}", streams, per_worker(streams),
                                             args.tokens, proc))
        sat_n = args.requests_per_stream or (4 if args.quick else 10)
        sat_direct = await _phase(replica.url, model, "sat-direct", args.sat_streams, sat_n, 1, None, stream=False)
        sat_router = await _phase(router.url, model, "sat-router", args.sat_streams, sat_n, 1, router, stream=False)
    finally:
        router.stop()
        replica.stop()
        redis.stop()
    return _report(args, rows, sat_direct, sat_router)


def _merge(rows: list[Row]) -> Row:
    samples = [s for r in rows for s in r.result.samples]
    wall = sum(r.result.wall_s for r in rows)
    merged = Row(rows[0].streams, rows[0].path, PhaseResult(samples, wall), sum(r.cpu_s for r in rows))
    merged.own_p50_ms = max(r.own_p50_ms for r in rows)
    merged.own_p99_ms = max(r.own_p99_ms for r in rows)
    return merged


def _report(args: argparse.Namespace, rows: list[Row], sat_direct: Row, sat_router: Row) -> dict[str, object]:
    print(f"# bench.router — {time.strftime('%Y-%m-%d %H:%M:%S')}")
    load1, load5, _ = os.getloadavg()
    print(f"machine: {os.cpu_count()} CPUs ({platform.machine()}), Python {platform.python_version()}, "
          f"{platform.system()} {platform.release()}; load average {load1:.2f} (1 min) {load5:.2f} (5 min) "
          f"at the end of the run")
    print(f"replica: tao vllm-sim --profile {args.profile} --time-scale {args.time_scale}; router policy "
          f"{args.policy}; {args.tokens} tokens per streamed request; load generator, router, replica and "
          f"Redis share the machine")
    print()
    header = (f"{'streams':>7} {'path':>6} {'reqs':>5} {'err':>3} {'TTFT p50':>9} {'TTFT p99':>9} "
              f"{'gap p99':>8} {'req/s':>8} {'chunks/s':>9} {'CPU us/tok':>10} {'CPU util':>8}")
    print(header)
    out: dict[str, object] = {"levels": {}}
    verdict = []
    for streams in sorted({r.streams for r in rows}):
        merged = {p: _merge([r for r in rows if r.streams == streams and r.path == p]) for p in ("direct", "router")}
        stats = {p: m.stats() for p, m in merged.items()}
        for p in ("direct", "router"):
            s = stats[p]
            print(f"{streams:>7} {p:>6} {s['requests']:>5.0f} {s['errors']:>3.0f} {_fmt(s['ttft_p50_ms']):>9} "
                  f"{_fmt(s['ttft_p99_ms']):>9} {_fmt(s['gap_p99_ms']):>8} {_fmt(s['req_per_s'], 1):>8} "
                  f"{_fmt(s['chunks_per_s'], 0):>9} {_fmt(s['cpu_us_per_chunk'], 1):>10} "
                  f"{_fmt(s['router_cpu_util'] * 100, 0) + '%' if p == 'router' else '':>8}")
        d, r = stats["direct"], stats["router"]
        added = {k: r[k] - d[k] for k in ("ttft_p50_ms", "ttft_p99_ms", "gap_p99_ms")}
        ratio = r["chunks_per_s"] / d["chunks_per_s"] if d["chunks_per_s"] else float("nan")
        print(f"{'':>7} {'added':>6} {'':>9} {_fmt(added['ttft_p50_ms']):>9} {_fmt(added['ttft_p99_ms']):>9} "
              f"{_fmt(added['gap_p99_ms']):>8}   throughput ratio router/direct {ratio:.3f}")
        print(f"{'':>7} {'own':>6} {'':>9} {_fmt(r['router_own_p50_ms'], 3):>9} {_fmt(r['router_own_p99_ms'], 3):>9}"
              f"            router's own time per request (tao_router_overhead_seconds)")
        out["levels"][str(streams)] = {"direct": d, "router": r, "added": added}  # type: ignore[index]
        if streams == 64:
            ok = added["ttft_p50_ms"] <= TARGET_P50_MS and added["ttft_p99_ms"] <= TARGET_P99_MS
            own_ok = r["router_own_p50_ms"] <= TARGET_P50_MS and r["router_own_p99_ms"] <= TARGET_P99_MS
            verdict.append(f"target at 64 streams (added TTFT p50 <= {TARGET_P50_MS} ms, p99 <= {TARGET_P99_MS} ms): "
                           f"end to end {'MET' if ok else 'NOT MET'} (p50 {added['ttft_p50_ms']:+.2f} ms, "
                           f"p99 {added['ttft_p99_ms']:+.2f} ms); router's own time "
                           f"{'MET' if own_ok else 'NOT MET'} (p50 {r['router_own_p50_ms']:.3f} ms, "
                           f"p99 {r['router_own_p99_ms']:.3f} ms)")
    sd, sr = sat_direct.stats(), sat_router.stats()
    print(f"{'':>7} {'own':>6} non-streaming: router's own time p50 {sr['router_own_p50_ms']:.3f} ms, "
          f"p99 {sr['router_own_p99_ms']:.3f} ms")
    util = sr["router_cpu_util"]
    print()
    print(f"sustained, {sat_router.streams} concurrent 1-token requests (non-streaming): direct {sd['req_per_s']:.0f} "
          f"req/s, router {sr['req_per_s']:.0f} req/s (ratio {sr['req_per_s'] / sd['req_per_s']:.3f}); router CPU "
          f"{util * 100:.0f}% of one core, {sr['cpu_us_per_chunk']:.0f} us CPU per request -> one router process "
          f"~{sr['req_per_s'] / util:.0f} req/s at 100% CPU")
    streamed = [r for r in rows if r.path == "router" and r.streams == max(x.streams for x in rows)]
    top = _merge(streamed).stats()
    print(f"streamed, {streamed[0].streams} streams: router relays {top['chunks_per_s']:.0f} chunks/s at "
          f"{top['router_cpu_util'] * 100:.0f}% CPU ({top['cpu_us_per_chunk']:.1f} us CPU per token, incl. the "
          f"request's share) -> ~{top['chunks_per_s'] / top['router_cpu_util']:.0f} chunks/s at 100% CPU")
    for line in verdict:
        print(line)
    out["sustained"] = {"direct": sd, "router": sr}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.router", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests per level (about a minute)")
    parser.add_argument("--policy", default="tao", help="router policy (default tao: sessions admitted by the "
                                                        "local fallback, then sticky)")
    parser.add_argument("--profile", default="qwen2.5-3b-h200", help="vllm-sim profile")
    parser.add_argument("--time-scale", type=float, default=1.0, help="vllm-sim time scale")
    parser.add_argument("--tokens", type=int, default=32, help="tokens per streamed request")
    parser.add_argument("--levels", default="1,64,256", help="concurrent streams per level (comma-separated)")
    parser.add_argument("--requests-per-stream", type=int, default=0,
                        help="measured requests per stream (default: about 200 per level and round with --quick, 600 "
                             "without; 40/150 at one stream; at least 2)")
    parser.add_argument("--sat-streams", type=int, default=256, help="streams of the sustained-rate phase")
    parser.add_argument("--json", default=None, help="write the figures as JSON here")
    args = parser.parse_args(argv)
    out = asyncio.run(run(args))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
