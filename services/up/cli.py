"""`tao up`: the whole stack on this machine with an agent workload, a live view, a comparison
against a baseline policy and a report folder. Ctrl-C / SIGTERM stop everything cleanly."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
import time
from datetime import datetime
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from services.common.extras import require
from services.driver.driver import DriverConfig, DriverResult, RequestResult, ToolEvents, TraceDriver
from services.driver.results import metrics_of, scrape_counters
from services.up.panels import MetricsSampler, write_panels
from services.up.procs import PortInUse
from services.up.report import comparison, write_report
from services.up.stack import Stack, StackAddresses, StackConfig

if TYPE_CHECKING:  # rich comes with the 'report' extra; imported where used
    from rich.console import Console
    from rich.table import Table


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--replicas", type=int, default=2, help="emulated vLLM replicas")
    parser.add_argument("--profile", default="qwen3-32b-h100x2", help="engine profile of the replicas")
    parser.add_argument("--workload", default="swe-lite", help="workload kind (tao workload generate --kind)")
    parser.add_argument("--sessions", type=int, default=16, help="agent sessions to run")
    parser.add_argument("--concurrency", type=int, default=None, help="sessions active at once (default: all)")
    parser.add_argument("--duration", type=float, default=None, help="stop each run's workload after S wall seconds")
    parser.add_argument("--policy", default="tao", help="placement policy under test")
    parser.add_argument("--compare", default="thunderagent",
                        help="baseline policy run on the same workload (default thunderagent, the strongest "
                             "baseline in the simulator; 'none' to skip)")
    parser.add_argument("--time-scale", type=float, default=20.0, help="simulated seconds per wall second")
    parser.add_argument("--seed", type=int, default=1, help="workload seed")
    parser.add_argument("--num-gpu-blocks", type=int, default=8000,
                        help="KV blocks (16 tokens) per replica; the default 8000 (128k tokens) makes 16 agent "
                             "sessions contend for KV cache the way 100+ do on a full-size replica; 0 = profile's")
    parser.add_argument("--budget", type=int, default=64, help="tenant admission budget B")
    parser.add_argument("--redis-url", default=None, help="use this Redis instead of an embedded one")
    parser.add_argument("--router-port", type=int, default=None, help="router HTTP port (default: a free one)")
    parser.add_argument("--report", type=Path, default=None, help="report folder (default: ./tao-report-<time>)")
    parser.add_argument("--no-workload", action="store_true", help="keep the stack up for your own agents")
    parser.add_argument("--kv-events", action="store_true",
                        help="the replicas publish vLLM KV events and the router subscribes (exact cache credit)")


class _Stop(Exception):
    pass


def _raise_stop(signum: int, frame: FrameType | None) -> None:
    raise _Stop()


class LiveStats:
    def __init__(self, policy: str, total_sessions: int) -> None:
        self.policy = policy
        self.total = total_sessions
        self.started = time.monotonic()
        self.requests = 0
        self.tokens = 0
        self.prompt = 0
        self.cached = 0
        self.ttft_sum = 0.0
        self.errors = 0
        self.phases: dict[str, int] = {}
        self.caps: dict[str, int] = {}

    def on_request(self, r: RequestResult) -> None:
        self.requests += 1
        if r.error:
            self.errors += 1
            return
        self.tokens += r.completion_tokens
        self.prompt += r.prompt_tokens
        self.cached += r.cached_tokens
        self.ttft_sum += r.ttft_s or 0.0

    def table(self, driver: TraceDriver) -> Table:
        from rich.table import Table

        elapsed = max(1e-6, time.monotonic() - self.started)
        t = Table(title=f"tao up — policy {self.policy} (times in model seconds)", show_header=True,
                  padding=(0, 1), collapse_padding=True)
        for col in ("time", "done", "active", "tool", "held", "paused", "req/s", "tok/s", "hit", "TTFT", "caps", "err"):
            t.add_column(col, no_wrap=True)
        ok = max(1, self.requests - self.errors)
        t.add_row(
            f"{elapsed:.0f} s", f"{driver.done}/{self.total}", str(driver.active), str(driver.acting),
            str(self.phases.get("WAITING", 0)), str(self.phases.get("PAUSED", 0)),
            f"{self.requests / elapsed:.1f}", f"{self.tokens / elapsed:.0f}",
            f"{(self.cached / self.prompt) if self.prompt else 0:.1%}", f"{self.ttft_sum / ok:.2f}",
            " ".join(f"{k}:{v}" for k, v in sorted(self.caps.items())) or "-", str(self.errors),
        )
        return t


async def _poll_control_plane(addrs: StackAddresses, stats: LiveStats) -> None:
    import grpc

    from tao.budget.v1 import budget_pb2, budget_pb2_grpc
    from tao.common.v1 import common_pb2
    from tao.router.v1 import router_pb2, router_pb2_grpc

    async with grpc.aio.insecure_channel(addrs.router_admin) as rch, grpc.aio.insecure_channel(addrs.budget) as bch:
        router = router_pb2_grpc.RouterAdminServiceStub(rch)
        budget = budget_pb2_grpc.BudgetServiceStub(bch)
        while True:
            with contextlib.suppress(grpc.aio.AioRpcError):
                reply = await router.ListSessions(router_pb2.ListSessionsRequest(), timeout=1)
                phases: dict[str, int] = {}
                for s in reply.sessions:
                    name = common_pb2.SessionPhase.Name(s.phase).removeprefix("SESSION_PHASE_")
                    phases[name] = phases.get(name, 0) + 1
                stats.phases = phases
            with contextlib.suppress(grpc.aio.AioRpcError):
                alloc = await budget.GetAllocation(budget_pb2.GetAllocationRequest(), timeout=1)
                stats.caps = dict(alloc.allocation.caps)
            await asyncio.sleep(1.0)


async def _drive(addrs: StackAddresses, sessions: list[Any], args: argparse.Namespace, policy: str,
                 console: Console, sampler: MetricsSampler | None = None) -> DriverResult:
    from rich.live import Live

    tools: ToolEvents | None = None
    with contextlib.suppress(ImportError):
        from services.driver.reporter_adapter import ReporterToolEvents

        tools = ReporterToolEvents(addrs.predictor, time_scale=args.time_scale)
    stats = LiveStats(policy, len(sessions))
    config = DriverConfig(base_url=addrs.router_url, time_scale=args.time_scale,
                          concurrency=args.concurrency or len(sessions), tenant_header="x-tao-tenant")
    driver = TraceDriver(config, tools, on_request=stats.on_request)
    poller = asyncio.create_task(_poll_control_plane(addrs, stats))
    sampling = asyncio.create_task(sampler.run()) if sampler is not None else None
    run = asyncio.create_task(driver.run(sessions))
    try:
        with Live(stats.table(driver), console=console, refresh_per_second=2, transient=False) as live:
            deadline = None if args.duration is None else time.monotonic() + args.duration
            while not run.done():
                await asyncio.wait({run}, timeout=0.5)
                live.update(stats.table(driver))
                if deadline is not None and time.monotonic() > deadline and not run.done():
                    run.cancel()
        try:
            return await run
        except asyncio.CancelledError:
            console.print(f"[yellow]--duration reached: {driver.done} sessions finished[/]")
            return DriverResult([], time.monotonic() - stats.started, args.time_scale, 0)
    finally:
        for task in (poller, sampling):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task


def no_workload_banner(addrs: StackAddresses) -> str:
    """What `tao up --no-workload` prints: every address an agent harness, the driver
    (``tao bench e2e --replica URL`` counts preemptions there) or an operator needs."""
    replicas = "\n".join(f"  {url}" for url in addrs.replicas)
    return (f"router (OpenAI API): {addrs.router_url}/v1\n"
            f"predictor (gRPC):    {addrs.predictor}\n"
            f"router admin (gRPC): {addrs.router_admin}\n"
            f"planner (gRPC):      {addrs.planner}\n"
            f"budget (gRPC):       {addrs.budget}   (tenants: tao tenants --budget {addrs.budget})\n"
            f"redis:               {addrs.redis_url}\n"
            f"replicas (vLLM API, /metrics):\n{replicas}\n"
            "Ctrl-C to stop.")


def _summary_table(policies: dict[str, dict[str, Any]], comparisons: dict[str, dict[str, float | None]]) -> Table:
    from rich.table import Table

    t = Table(title="TAO vs baseline (model seconds; improvement: positive = better)")
    keys = ["mean_task_latency_s", "p90_task_latency_s", "latency_over_lower_bound", "latency_over_capacity_bound",
            "busy_over_work_bound", "mean_ttft_s",
            "mean_ttft_after_tool_s", "decode_tok_s_makespan", "decode_tok_s_busy", "prefix_hit_rate",
            "mean_pause_wait_s", "completed_sessions", "errors"]
    t.add_column("metric")
    for name in policies:
        t.add_column(name, justify="right")
    for label in comparisons:
        t.add_column(label, justify="right")
    for key in keys:
        row = [key]
        for metrics in policies.values():
            v = metrics.get(key)
            row.append(f"{v:.4g}" if isinstance(v, float) else ("n/a" if v is None else str(v)))
        for deltas in comparisons.values():
            d = deltas.get(key)
            row.append("" if d is None else f"{d:+.1f} %")
        t.add_row(*row)
    return t


def run(args: argparse.Namespace) -> int:
    require("report", "the live view and the report PNGs")
    from rich.console import Console

    from services.sim.cluster.lower_bound import capacity_bound, lower_bound
    from services.sim.engine import get_profile
    from services.sim.workload.generate import GenerateOptions, generate
    from services.sim.workload.trace import write_trace

    console = Console()
    signal.signal(signal.SIGTERM, _raise_stop)
    report_dir: Path = args.report or Path(f"tao-report-{datetime.now():%Y%m%d-%H%M%S}")
    policies_to_run = [args.policy] + ([] if args.no_workload or args.compare in ("none", "") else [args.compare])
    sessions = generate(GenerateOptions(kind=args.workload, sessions=args.sessions, seed=args.seed))
    # The no-contention lower bound of this trace on the replicas' engine model and profile.
    try:
        profile = get_profile(args.profile)
    except (KeyError, ValueError):
        print(f"tao up: unknown profile {args.profile!r}", file=sys.stderr)
        return 2
    bound = lower_bound(sessions, profile)
    capacity = capacity_bound(sessions, profile, args.replicas, args.concurrency, args.num_gpu_blocks or None)
    tenants = tuple(sorted({s.tenant for s in sessions}))
    results: dict[str, DriverResult] = {}
    metrics: dict[str, dict[str, Any]] = {}
    stack: Stack | None = None
    panel_pngs: list[Path] = []
    try:
        report_dir.mkdir(parents=True, exist_ok=True)
        write_trace(sessions, report_dir / "trace.jsonl")
        for policy in policies_to_run:
            cfg = StackConfig(replicas=args.replicas, profile=args.profile, policy=policy, time_scale=args.time_scale,
                              redis_url=args.redis_url, router_http_port=args.router_port,
                              num_gpu_blocks=args.num_gpu_blocks or None, total_budget=args.budget, tenants=tenants,
                              log_dir=report_dir / "logs" / policy, kv_events=args.kv_events)
            stack = Stack(cfg)
            console.print(f"[bold]starting the stack[/] (policy {policy}, {args.replicas} × {args.profile}, "
                          f"time scale {args.time_scale}) …")
            addrs = stack.start()
            if args.no_workload:
                console.print(no_workload_banner(addrs))
                while not stack.failed():
                    time.sleep(1.0)
                console.print(f"[red]a process died:[/] {stack.failed()}")
                return 1
            sampler = MetricsSampler(addrs.metrics_urls)
            result = asyncio.run(_drive(addrs, sessions, args, policy, console, sampler))
            panel_pngs += write_panels(report_dir / "panels", sampler.scrapes, policy)
            counters = asyncio.run(scrape_counters(addrs.replicas))  # a fresh stack: counted from 0
            results[policy] = result
            metrics[policy] = metrics_of(result, counters.preemptions, counters.busy_s)
            done = [s.session_id for s in result.sessions if s.completed]
            lb_mean = bound.mean_of(done)
            metrics[policy]["latency_over_lower_bound"] = (
                metrics[policy]["mean_task_latency_s"] / lb_mean if lb_mean > 0 and done else None)
            metrics[policy].update(capacity.ratios(metrics[policy]["mean_task_latency_s"], counters.busy_s,
                                                   len(done) == len(sessions)))
            stack.stop()
            stack = None
        comparisons = {}
        if len(policies_to_run) > 1:
            comparisons[f"{args.policy} vs {args.compare}"] = comparison(metrics, args.policy, args.compare)
        config = {"replicas": args.replicas, "profile": args.profile, "workload": args.workload,
                  "sessions": args.sessions, "time_scale": args.time_scale, "policies": policies_to_run,
                  "seed": args.seed, "budget": args.budget}
        page = write_report(report_dir, config, metrics, results, comparisons, lower_bound=bound.to_json(),
                            capacity_bound=capacity.to_json(), panels=panel_pngs)
        console.print(_summary_table(metrics, comparisons))
        lb = bound.to_json()
        console.print(f"no-contention lower bound ({args.profile}, each session alone, cache never evicted, tools at "
                      f"trace duration): mean {lb['mean_task_latency_s']:.1f} s; latency_over_lower_bound = mean "
                      f"task latency / that bound")
        console.print(f"capacity bound (the fleet's least engine-seconds, KV-limited batches; docs/algorithms.md#lower-bounds): "
                      f"mean {capacity.mean_task_latency_s:.1f} s ({capacity.binding} binds), least engine work "
                      f"{capacity.work_s:.0f} s; latency_over_capacity_bound = mean task latency / that bound, "
                      f"busy_over_work_bound = the replicas' busy seconds / that work")
        console.print(f"report: {page}")
        return 0 if all(m["errors"] == 0 for m in metrics.values()) else 1
    except PortInUse as exc:
        print(f"tao up: {exc}", file=sys.stderr)
        return 2
    except (_Stop, KeyboardInterrupt):
        console.print("[yellow]stopping …[/]")
        return 130
    except RuntimeError as exc:
        print(f"tao up: {exc}", file=sys.stderr)
        return 1
    finally:
        if stack is not None:
            stack.stop()
