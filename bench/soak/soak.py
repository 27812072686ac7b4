"""`python -m bench.soak [--minutes 10] [--sessions 128]`: a bounded soak of the real stack.

Starts redis-server, the four services and the emulated replicas (``services.up.stack``),
runs ``--sessions`` concurrent agents (``bench.faults.workload.AgentLoad``: multi-turn
sessions with tool calls reported to the predictor, each released at its end, new ones
started continuously) for ``--minutes``, and every ``--interval`` seconds samples each
process: resident memory (``VmRSS`` from /proc/PID/status), open file descriptors
(/proc/PID/fd) and threads, plus the requests and errors so far.

Baseline, measured in the same run: each process's first sample after the warm-up
(``--warmup`` seconds). The report prints the growth of RSS and fds against it (a ratio, and
a slope per 10 minutes from a least-squares fit over the post-warm-up samples), the error
counts by kind, and the machine. Growth that continues linearly is what a leak looks like;
a ratio near 1.0 after warm-up is what a healthy service looks like.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bench.faults.workload import AgentLoad, LoadConfig, LoadResult
from services.up.stack import Stack, StackConfig


@dataclass
class ProcSample:
    rss_mb: float
    fds: int
    threads: int


@dataclass
class Tick:
    t_s: float
    requests: int
    errors: int
    procs: dict[str, ProcSample] = field(default_factory=dict)


def sample(pid: int) -> ProcSample | None:
    """RSS, open fds and threads of ``pid`` from /proc (None when it is gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    rss_kb = threads = 0
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            rss_kb = int(line.split()[1])
        elif line.startswith("Threads:"):
            threads = int(line.split()[1])
    return ProcSample(round(rss_kb / 1024, 1), fds, threads)


def slope_per_10min(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (t_s, value), scaled to 10 minutes (0 with fewer than 2 points)."""
    if len(points) < 2:
        return 0.0
    n = len(points)
    mt = sum(t for t, _ in points) / n
    mv = sum(v for _, v in points) / n
    var = sum((t - mt) ** 2 for t, _ in points)
    if var == 0:
        return 0.0
    return sum((t - mt) * (v - mv) for t, v in points) / var * 600.0


def report(ticks: list[Tick], warmup_s: float) -> dict[str, dict[str, float]]:
    """Per process: baseline (first sample after warm-up), last, ratio, slope per 10 min."""
    out: dict[str, dict[str, float]] = {}
    names = sorted({n for t in ticks for n in t.procs})
    for name in names:
        series = [(t.t_s, t.procs[name]) for t in ticks if name in t.procs]
        after = [(t, s) for t, s in series if t >= warmup_s] or series
        if not after:
            continue
        base, last = after[0][1], after[-1][1]
        out[name] = {
            "rss_base_mb": base.rss_mb, "rss_last_mb": last.rss_mb,
            "rss_ratio": round(last.rss_mb / base.rss_mb, 3) if base.rss_mb else 0.0,
            "rss_mb_per_10min": round(slope_per_10min([(t, s.rss_mb) for t, s in after]), 2),
            "fds_base": base.fds, "fds_last": last.fds, "fds_max": max(s.fds for _, s in series),
            "fds_per_10min": round(slope_per_10min([(t, float(s.fds)) for t, s in after]), 2),
            "threads_last": last.threads,
        }
    return out


def _errors(result: LoadResult) -> dict[str, int]:
    kinds: dict[str, int] = {}
    for a in result.attempts:
        if a.kind != "ok" and a.ended_s > 0:
            kinds[a.kind] = kinds.get(a.kind, 0) + 1
    return kinds


def _print_tick(tick: Tick, names: list[str]) -> None:
    cells = "  ".join(f"{n}:{tick.procs[n].rss_mb:.0f}MB/{tick.procs[n].fds}fd" for n in names if n in tick.procs)
    print(f"[{tick.t_s:6.0f} s] requests {tick.requests:>7}  errors {tick.errors:>4}  {cells}", flush=True)


async def _soak(args: argparse.Namespace, stack: Stack) -> dict[str, object]:
    from services.driver.reporter_adapter import ReporterToolEvents

    addrs = stack.addresses
    assert addrs is not None
    tools = ReporterToolEvents(addrs.predictor, time_scale=args.time_scale)
    load = AgentLoad(LoadConfig(addrs.router_url, "Qwen/Qwen3-32B", name="soak", agents=args.sessions,
                                turns=args.turns, output_tokens=args.output_tokens, stream_every=2,
                                tool_s=args.tool_s, request_timeout_s=120.0), tools)
    ticks: list[Tick] = []
    names = [c.name for c in stack.sup.children]
    stop = asyncio.Event()
    started = time.monotonic()
    runner = asyncio.create_task(load.run(stop))
    try:
        deadline = started + args.minutes * 60.0
        while True:
            now = time.monotonic()
            tick = Tick(round(now - started, 1), len(load.result.requests), sum(_errors(load.result).values()))
            for child in stack.sup.children:
                if child.pid is not None and (s := sample(child.pid)) is not None:
                    tick.procs[child.name] = s
            ticks.append(tick)
            _print_tick(tick, names)
            if now >= deadline or runner.done():
                break
            await asyncio.sleep(min(args.interval, max(0.1, deadline - now)))
    finally:
        stop.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(runner, 180)
        await tools.close()
        dead = [c.name for c in stack.sup.dead_children()]
    wall = time.monotonic() - started
    result = load.result
    return {
        "config": {k: v for k, v in vars(args).items() if not isinstance(v, Path)},
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "wall_s": round(wall, 1), "requests": len(result.requests), "sessions_started": result.sessions_started,
        "requests_per_s": round(len(result.requests) / wall, 2) if wall else 0.0,
        "errors": _errors(result), "final": {k: result.final(k) for k in ("ok", "clean_error", "cut", "lost")},
        "died": dead, "growth": report(ticks, args.warmup), "ticks": [asdict(t) for t in ticks],
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--minutes", type=float, default=10.0, help="how long the workload runs")
    parser.add_argument("--sessions", type=int, default=128, help="concurrent agent sessions")
    parser.add_argument("--interval", type=float, default=10.0, help="seconds between samples")
    parser.add_argument("--warmup", type=float, default=60.0, help="seconds before the baseline sample")
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--time-scale", type=float, default=10.0)
    parser.add_argument("--budget", type=int, default=64, help="tenant admission budget B")
    parser.add_argument("--num-gpu-blocks", type=int, default=None)
    parser.add_argument("--turns", type=int, default=8, help="requests per session")
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--tool-s", type=float, default=0.3, help="wall seconds per tool call")
    parser.add_argument("--json", type=Path, default=None, help="write the samples and report here")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    # a soak drives the budget to its caps on purpose: overload holds stay long (the old Stack default)
    stack = Stack(StackConfig(replicas=args.replicas, time_scale=args.time_scale, total_budget=args.budget,
                              num_gpu_blocks=args.num_gpu_blocks, hold_timeout_s=600.0))
    print(f"starting the stack ({args.replicas} replicas, time scale {args.time_scale:g}) ...", flush=True)
    try:
        stack.start()  # from this thread: children die with it (PR_SET_PDEATHSIG is per thread)
        out = asyncio.run(_soak(args, stack))
    finally:
        stack.stop()
    print()
    print(f"machine: {out['machine']}")
    print(f"{out['requests']} requests in {out['wall_s']} s ({out['requests_per_s']} req/s), "
          f"{out['sessions_started']} sessions; errors by kind: {out['errors'] or 'none'}; died: {out['died'] or 'none'}")
    print(f"{'process':<10} {'RSS base':>9} {'RSS last':>9} {'ratio':>6} {'MB/10min':>9} "
          f"{'fds base':>8} {'fds last':>8} {'fds max':>7} {'fds/10min':>9}")
    growth = out["growth"]
    assert isinstance(growth, dict)
    for name, g in growth.items():
        print(f"{name:<10} {g['rss_base_mb']:>9.1f} {g['rss_last_mb']:>9.1f} {g['rss_ratio']:>6.2f} "
              f"{g['rss_mb_per_10min']:>9.1f} {g['fds_base']:>8.0f} {g['fds_last']:>8.0f} {g['fds_max']:>7.0f} "
              f"{g['fds_per_10min']:>9.1f}")
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=2))
    final = out["final"]
    assert isinstance(final, dict)
    return 0 if not out["died"] and final.get("lost", 0) == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
