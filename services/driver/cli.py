"""`tao bench e2e --trace F --router URL [--predictor ADDR] [--time-scale X] [--json OUT]`."""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import sys
from pathlib import Path
from typing import Any

from services.driver.driver import DriverConfig, ToolEvents, TraceDriver
from services.driver.results import measure
from services.sim.workload.trace import TraceError, load_trace


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trace", required=True, type=Path, help="trace JSONL (tao workload generate)")
    parser.add_argument("--router", required=True, help="base URL of the endpoint, e.g. http://127.0.0.1:8080")
    parser.add_argument("--predictor", default=None, help="predictor HOST:PORT to stream tool events to")
    parser.add_argument("--time-scale", type=float, default=1.0,
                        help="replicas' time scale: tool durations are divided by it, times reported x it")
    parser.add_argument("--concurrency", type=int, default=64, help="at most this many sessions active")
    parser.add_argument("--api-key", default="EMPTY", help="API key sent as Bearer token")
    parser.add_argument("--tenant-header", action="store_true", help="send x-tao-tenant (router dev mode)")
    parser.add_argument("--replica", action="append", default=[], help="replica URL to scrape preemptions from")
    parser.add_argument("--label", default="e2e", help="name of this run in the JSON policies map")
    parser.add_argument("--json", type=Path, default=None, help="write the JSON result here")


async def play(args: argparse.Namespace) -> dict[str, Any]:
    sessions = load_trace(args.trace)
    tools: ToolEvents | None = None
    if args.predictor:
        from services.driver.reporter_adapter import ReporterToolEvents

        tools = ReporterToolEvents(args.predictor, time_scale=args.time_scale)
    config = DriverConfig(base_url=args.router.rstrip("/"), time_scale=args.time_scale,
                          concurrency=args.concurrency, api_key=args.api_key,
                          tenant_header="x-tao-tenant" if args.tenant_header else None)
    metrics = await measure(TraceDriver(config, tools), sessions, args.replica)
    return {
        "config": {"trace": str(args.trace), "router": args.router, "predictor": args.predictor,
                   "time_scale": args.time_scale, "concurrency": args.concurrency, "sessions": len(sessions),
                   "machine": {"cpus": __import__("os").cpu_count(), "python": platform.python_version()}},
        "policies": {args.label: metrics},
    }


def run(args: argparse.Namespace) -> int:
    try:
        out = asyncio.run(play(args))
    except TraceError as exc:
        print(f"tao bench e2e: {exc}", file=sys.stderr)
        return 2
    except (OSError, RuntimeError) as exc:
        print(f"tao bench e2e: {exc}", file=sys.stderr)
        return 1
    text = json.dumps(out, indent=2)
    if args.json:
        args.json.write_text(text + "\n")
    metrics = out["policies"][args.label]
    width = max(len(k) for k in metrics)
    for key, value in metrics.items():
        print(f"{key:<{width}}  {value:.4g}" if isinstance(value, float) else f"{key:<{width}}  {value}")
    return 0 if metrics["errors"] == 0 else 1
