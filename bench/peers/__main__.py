"""`python -m bench.peers` — real routers you can `pip install`, side by side with TAO.

Each system (see ``bench/peers/core.py``) gets fresh emulated replicas (`tao vllm-sim`, the same
profile, KV size and time scale for all), its router in front, and the same agent trace played
by the `tao bench e2e` driver (closed loop; tool durations scaled; preemptions and busy time
read from the replicas). Systems run one after another, in rounds (``--repeat``), the order
reversed every other round so slow drift of the machine hits all alike; the table shows the
mean over the rounds and the run-to-run spread ((max − min) / mean) of latency and TTFT.

The peers (`vllm-router`, `sglang-router`, and `ai-dynamo-runtime` with aiohttp for `dynamo:kv`)
are installed from PyPI into their own venv
(``--venv``, default ~/.cache/tao-peers/venv; reused when present), never into this
package's environment. The real ThunderAgent (``thunderagent-real``) is pip-installed into the
same venv from the checkout given with ``--thunderagent-src`` (skipped without one). A system
that cannot run says why in the table.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from functools import partial
from pathlib import Path
from typing import Any

from bench.peers.core import (
    EXTRA_REQUIREMENTS,
    IMPORTS,
    KV_EVENTS_CONFIG,
    THUNDERAGENT_REAL,
    System,
    dynamo_kv_args,
    kv_event_router_args,
    markdown_table,
    parse_systems,
    router_argv,
    table_rows,
    verdict,
)
from services.common.ports import free_port
from services.common.stats import histogram_quantile
from services.driver.driver import DriverConfig, ToolEvents, TraceDriver
from services.driver.results import measure
from services.planner.core.registry import POLICIES
from services.sim.engine import PROFILES, get_profile
from services.sim.workload.generate import GenerateOptions, generate
from services.sim.workload.params import KINDS
from services.sim.workload.trace import TraceSession, write_trace
from services.up.panels import parse as parse_metrics
from services.up.procs import Supervisor, tao_argv
from services.up.stack import Stack, StackConfig, http_ok

DEFAULT_VENV = Path.home() / ".cache" / "tao-peers" / "venv"


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.peers", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--systems", default="default",
                    help="comma-separated: floor, vllm-router:POLICY, sglang-router:POLICY, dynamo:kv, tao:POLICY, "
                         f"{THUNDERAGENT_REAL} (the ThunderAgent project's proxy; needs --thunderagent-src; "
                         f"{THUNDERAGENT_REAL}:model-time: its 5 s intervals in model time); "
                         "'default' and 'all' expand (bench/peers/core.py)")
    ap.add_argument("--kind", default="swe-lite", choices=sorted(KINDS), help="workload kind (default swe-lite)")
    ap.add_argument("--sessions", type=int, default=12,
                    help="sessions in the trace (default 12: the default run fits 15 min on 2 cores)")
    ap.add_argument("--concurrency", type=int, default=None, help="sessions active at once (default: all)")
    ap.add_argument("--seed", type=int, default=1, help="workload seed (default 1, as `tao up`)")
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--profile", default="qwen3-32b-h100x2", help="engine profile of every replica")
    ap.add_argument("--num-gpu-blocks", type=int, default=6000,
                    help="KV blocks per replica (default 6000: 12 sessions contend for it as `tao up`'s 16 do "
                         "for 8000)")
    ap.add_argument("--time-scale", type=float, default=20.0, help="model seconds per wall second (default 20)")
    ap.add_argument("--repeat", type=int, default=2, help="rounds over all systems (default 2)")
    ap.add_argument("--venv", type=Path, default=DEFAULT_VENV, help=f"the peers' venv (default {DEFAULT_VENV})")
    ap.add_argument("--vllm-router-spec", default="vllm-router==0.1.17",
                    help="pip requirement for vllm-router (default: the version docs/benchmarks.md measured)")
    ap.add_argument("--sglang-router-spec", default="sglang-router==0.3.2",
                    help="pip requirement for sglang-router (default: the version docs/benchmarks.md measured)")
    ap.add_argument("--ai-dynamo-runtime-spec", default="ai-dynamo-runtime==1.6.1",
                    help="pip requirement for NVIDIA Dynamo's runtime (dynamo:kv; default: the version "
                         "docs/benchmarks.md measured)")
    ap.add_argument("--thunderagent-src", type=Path, default=None, metavar="DIR",
                    help=f"a checkout of ThunderAgent (github.com/ThunderAgent-org/ThunderAgent) for {THUNDERAGENT_REAL}: "
                         "pip-installed into --venv; without it that system is skipped")
    ap.add_argument("--json", dest="json_out", type=Path, default=None, help="write every run and the table here")
    ap.add_argument("--log-dir", type=Path, default=None, help="keep the routers' and replicas' logs here")
    ap.add_argument("--table-from", type=Path, default=None,
                    help="print the table and verdict of a --json file of an earlier run, run nothing")
    args = ap.parse_args(argv)
    try:
        args.system_list = parse_systems(args.systems, sorted(POLICIES))
    except ValueError as exc:
        ap.error(str(exc))
    if args.profile not in PROFILES:
        ap.error(f"unknown profile {args.profile!r}; known: {', '.join(sorted(PROFILES))}")
    for name in ("sessions", "replicas", "num_gpu_blocks", "repeat"):
        if getattr(args, name) <= 0:
            ap.error(f"--{name.replace('_', '-')} must be > 0")
    if args.concurrency is not None and args.concurrency <= 0:
        ap.error("--concurrency must be > 0")
    if args.time_scale <= 0:
        ap.error("--time-scale must be > 0")
    if args.thunderagent_src is not None and not (args.thunderagent_src / "pyproject.toml").is_file() \
            and not (args.thunderagent_src / "setup.py").is_file():
        ap.error(f"--thunderagent-src {args.thunderagent_src}: not a Python project (no pyproject.toml or setup.py)")
    return args


# ------------------------------------------------------------------------------ peers' venv

def _ensure_venv(venv: Path) -> str | None:
    """Create ``venv`` when it has no python; the reason when that fails."""
    if (venv / "bin" / "python").exists():
        return None
    proc = subprocess.run([sys.executable, "-m", "venv", str(venv)], capture_output=True, text=True)
    return None if proc.returncode == 0 else f"could not create the venv {venv}: {proc.stderr.strip()[-300:]}"


def source_identity(src: Path) -> str:
    """Which ThunderAgent source was measured: ``git`` commit of a checkout (``+dirty`` when
    tracked files changed), else the path and a sha256 over its files (``.git`` and what ``pip
    install`` leaves in the folder excluded: ``build/``, ``*.egg-info/``, ``__pycache__/``)."""
    proc = subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True, text=True)
    if proc.returncode == 0:
        dirty = subprocess.run(["git", "-C", str(src), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True)
        return f"commit {proc.stdout.strip()}{'+dirty' if dirty.stdout.strip() else ''} ({src})"
    h = hashlib.sha256()

    def built(p: Path) -> bool:
        parts = p.relative_to(src).parts
        return bool({".git", "__pycache__"} & set(parts)) or parts[0] == "build" \
            or any(x.endswith(".egg-info") for x in parts)

    for f in sorted(p for p in src.rglob("*") if p.is_file() and not built(p)):
        h.update(str(f.relative_to(src)).encode() + b"\0" + f.read_bytes() + b"\0")
    return f"{src} (not a git checkout; files sha256 {h.hexdigest()[:16]})"


def ensure_thunderagent(venv: Path, src: Path) -> tuple[str | None, str | None]:
    """``pip install`` the ThunderAgent checkout ``src`` (its pyproject: fastapi, httpx, uvicorn;
    console script ``thunderagent``) into ``venv``, afresh every time so the source given is the
    one that runs. Returns (what was installed, None) or (None, why not)."""
    why = _ensure_venv(venv)
    if why:
        return None, why
    src = src.resolve()
    ident = source_identity(src)
    print(f"bench.peers: installing ThunderAgent from {ident} into {venv} …", flush=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    for cmd in (pip + [str(src)], pip + ["--no-deps", "--force-reinstall", str(src)]):
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            return None, "pip install failed: " + " | ".join(tail)[-300:]
    if not (venv / "bin" / "thunderagent").exists():
        return None, f"no thunderagent script in {venv}/bin after pip install {src}"
    proc = subprocess.run([str(venv / "bin" / "python"), "-c",
                           "import importlib.metadata as m; print(m.version('ThunderAgent'))"],
                          capture_output=True, text=True)
    return f"{proc.stdout.strip() or '?'} from {ident}", None


def _version(bin_dir: Path, package: str) -> tuple[str | None, str]:
    """(``package``'s version, None when it is not usable in the venv; the probe's stderr). Usable:
    its console script exists, or (``IMPORTS``) its modules import."""
    if package not in IMPORTS and not (bin_dir / package).exists():
        return None, f"no {package} script in {bin_dir}"
    imports = "".join(f"import {m}; " for m in IMPORTS.get(package, ()))
    proc = subprocess.run([str(bin_dir / "python"), "-c",
                           f"{imports}import importlib.metadata as m; print(m.version({package!r}))"],
                          capture_output=True, text=True)
    return (proc.stdout.strip() if proc.returncode == 0 else None), proc.stderr.strip()


def ensure_peers(venv: Path, specs: dict[str, str]) -> tuple[str, dict[str, str], dict[str, str]]:
    """Create ``venv`` if needed and pip-install the packages of ``specs`` ({package: requirement})
    that are not usable yet (``_version``), with their ``EXTRA_REQUIREMENTS``. Returns (bin dir,
    {package: version}, {package: why it is not available})."""
    bin_dir = venv / "bin"
    failed: dict[str, str] = {}
    why = _ensure_venv(venv)
    if why:
        return str(bin_dir), {}, {p: why for p in specs}
    found = {p: _version(bin_dir, p) for p in specs}
    missing = [p for p, (v, _) in found.items() if v is None]
    if missing:
        reqs = [r for p in missing for r in (specs[p], *EXTRA_REQUIREMENTS.get(p, ()))]
        print(f"bench.peers: installing {', '.join(reqs)} into {venv} …", flush=True)
        proc = subprocess.run([str(bin_dir / "python"), "-m", "pip", "install", "-q", *reqs],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            for p in missing:
                failed[p] = "pip install failed: " + " | ".join(tail)[-300:]
        found |= {p: _version(bin_dir, p) for p in missing if p not in failed}
    versions: dict[str, str] = {}
    for p, (version, err) in found.items():
        if p in failed:
            continue
        if version is None:
            failed[p] = f"{p} not importable in {venv}: {err[-200:]}"
        else:
            versions[p] = version
    return str(bin_dir), versions, failed


# --------------------------------------------------------------------------------- one run

def _start_replicas(sup: Supervisor, args: argparse.Namespace, kv_events: bool = False) -> list[str]:
    ports = [free_port() for _ in range(args.replicas)]
    extra = ["--kv-events-config", json.dumps(KV_EVENTS_CONFIG)] if kv_events else []
    for i, port in enumerate(ports):
        sup.spawn(f"vllm-{i}", tao_argv("vllm-sim", "--port", str(port), "--profile", args.profile,
                                        "--time-scale", str(args.time_scale),
                                        "--num-gpu-blocks", str(args.num_gpu_blocks), *extra))
    for i, port in enumerate(ports):
        sup.wait_until(sup.find(f"vllm-{i}"), partial(http_ok, f"http://127.0.0.1:{port}/health"), 30, "healthy")
    return [f"http://127.0.0.1:{p}" for p in ports]


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())


def _kv_event_sources(replicas: list[str]) -> dict[str, dict[str, Any]]:
    """Each replica's rank-0 KV-event publisher, from vLLM's ``GET /kv_event_sources``."""
    out: dict[str, dict[str, Any]] = {}
    for url in replicas:
        sources = _get_json(f"{url}/kv_event_sources")["sources"]
        if not sources:
            raise RuntimeError(f"{url}/kv_event_sources lists no publisher")
        out[url] = sources[0]
    return out


def _max_model_len(replica: str) -> int:
    """The replica's context length, as vLLM's ``GET /v1/models`` reports it (``max_model_len``)."""
    return int(_get_json(f"{replica}/v1/models")["data"][0]["max_model_len"])


async def _drive(url: str, sessions: list[TraceSession], replicas: list[str], args: argparse.Namespace,
                 tools: ToolEvents | None, tenant_header: str | None) -> dict[str, Any]:
    config = DriverConfig(base_url=url, time_scale=args.time_scale, concurrency=args.concurrency or len(sessions),
                          model=get_profile(args.profile).model_name, tenant_header=tenant_header)
    return await measure(TraceDriver(config, tools), sessions, replicas)


def router_plan_metrics(router_url: str) -> dict[str, Any]:
    """The TAO router's plan figures after a run: how old plans are when applied (model seconds,
    ``tao_router_plan_age_seconds`` p50 / p90 as PromQL's ``histogram_quantile`` reads them; None
    without plans) and their parts by outcome (``tao_router_plan_parts_total``)."""
    with urllib.request.urlopen(router_url + "/metrics", timeout=10) as resp:
        values = parse_metrics(resp.read().decode())
    buckets = [(float(dict(labels)["le"]), v) for (name, labels), v in values.items()
               if name == "tao_router_plan_age_seconds_bucket"]
    parts = {dict(labels)["outcome"]: int(v) for (name, labels), v in values.items()
             if name == "tao_router_plan_parts_total"}

    def age(q: float) -> float | None:
        v = histogram_quantile(buckets, q)
        return None if math.isnan(v) else round(v, 3)

    return {"plans": int(max((n for _, n in buckets), default=0)), "age_p50_s": age(50), "age_p90_s": age(90),
            "parts": parts}


def run_one(system: System, sessions: list[TraceSession], args: argparse.Namespace, bin_dir: str,
            log_dir: Path) -> dict[str, Any]:
    """One run of ``system`` on fresh replicas; the driver's metrics (RuntimeError when it
    cannot start or a process dies)."""
    if system.kind == "tao":
        from services.driver.reporter_adapter import ReporterToolEvents

        tenants = tuple(sorted({s.tenant for s in sessions}))
        conc = args.concurrency or len(sessions)
        stack = Stack(StackConfig(replicas=args.replicas, profile=args.profile, policy=system.policy,
                                  time_scale=args.time_scale, num_gpu_blocks=args.num_gpu_blocks,
                                  total_budget=max(64, 2 * conc), tenants=tenants, log_dir=log_dir))
        try:
            addrs = stack.start()
            tools = ReporterToolEvents(addrs.predictor, time_scale=args.time_scale)
            metrics = asyncio.run(_drive(addrs.router_url, sessions, addrs.replicas, args, tools, "x-tao-tenant"))
            metrics["router_plans"] = router_plan_metrics(addrs.router_url)
            dead = stack.failed()
            if dead:
                raise RuntimeError(f"a process died during the run: {dead}")
            return metrics
        finally:
            stack.stop()
    sup = Supervisor(log_dir)
    try:
        replicas = _start_replicas(sup, args, kv_events=system.needs_kv_events)
        kv_args: list[str] = []
        if system.needs_kv_events:
            profile = get_profile(args.profile)
            sources = _kv_event_sources(replicas)
            if system.kind == "dynamo":
                kv_args = dynamo_kv_args(sources, profile.model_name, profile.block_size, args.num_gpu_blocks,
                                         _max_model_len(replicas[0]), str(log_dir / "dynamo-discovery"))
            else:
                kv_args = kv_event_router_args(sources, profile.model_name, profile.block_size)
        port = free_port()
        child = sup.spawn("router", router_argv(system, bin_dir, port, replicas, free_port(), python=sys.executable,
                                                kv_args=kv_args, profile_dir=str(log_dir / "thunderagent-profiles"),
                                                time_scale=args.time_scale))
        url = f"http://127.0.0.1:{port}"
        sup.wait_until(child, lambda: http_ok(f"{url}/health"), 60, "answering /health")
        metrics = asyncio.run(_drive(url, sessions, replicas, args, None, None))
        dead = [f"{c.name}: {c.tail(2)}" for c in sup.dead_children()]
        if dead:
            raise RuntimeError(f"a process died during the run: {dead}")
        return metrics
    finally:
        sup.stop_all()


# ------------------------------------------------------------------------------------ main

def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.table_from:
        doc = json.loads(args.table_from.read_text())
        print(markdown_table(table_rows(doc["runs"], {**doc.get("failures", {}), **doc.get("skipped", {})})))
        print()
        print(verdict(doc["runs"]))
        return 0
    t0 = time.monotonic()
    systems: list[System] = args.system_list
    specs = {p: getattr(args, f"{p.replace('-', '_')}_spec") for p in
             sorted({s.package for s in systems if s.package})}
    bin_dir, versions, unavailable = ensure_peers(args.venv, specs) if specs else (str(args.venv / "bin"), {}, {})
    skipped: dict[str, str] = {}
    ta_systems = [s.name for s in systems if s.kind == THUNDERAGENT_REAL]
    if ta_systems:
        if args.thunderagent_src is None:
            for name in ta_systems:
                skipped[name] = "skipped: no --thunderagent-src (a ThunderAgent checkout) given"
                print(f"bench.peers: {name} {skipped[name]}", flush=True)
        else:
            installed, why = ensure_thunderagent(args.venv, args.thunderagent_src)
            if installed:
                versions["ThunderAgent"] = installed
            else:
                unavailable[THUNDERAGENT_REAL] = why or "not installed"
    sessions = generate(GenerateOptions(kind=args.kind, sessions=args.sessions, seed=args.seed))
    log_root = args.log_dir or Path(tempfile.mkdtemp(prefix="tao-peers-"))
    log_root.mkdir(parents=True, exist_ok=True)
    write_trace(sessions, log_root / "trace.jsonl")
    print(f"bench.peers: {args.kind}, {len(sessions)} sessions (concurrency {args.concurrency or len(sessions)}), "
          f"{args.replicas} × {args.profile}, {args.num_gpu_blocks} KV blocks each, time scale {args.time_scale}, "
          f"{args.repeat} rounds; peers {versions or 'none'}; logs in {log_root}", flush=True)
    runs: dict[str, list[dict[str, Any]]] = {s.name: [] for s in systems}
    failures: dict[str, str] = {}
    for s in systems:
        if s.package in unavailable:
            failures[s.name] = unavailable[s.package]
        elif s.kind == THUNDERAGENT_REAL and THUNDERAGENT_REAL in unavailable:
            failures[s.name] = unavailable[THUNDERAGENT_REAL]
    for k in range(args.repeat):
        order = systems if k % 2 == 0 else list(reversed(systems))
        for system in order:
            if system.name in failures or system.name in skipped:
                continue
            log_dir = log_root / f"{system.name.replace(':', '-')}-{k + 1}"
            t1 = time.monotonic()
            try:
                m = run_one(system, sessions, args, bin_dir, log_dir)
            except (RuntimeError, OSError) as exc:
                failures[system.name] = str(exc)[:300]
                print(f"  {system.name:<32} FAILED: {failures[system.name]}", flush=True)
                continue
            runs[system.name].append(m)
            busy = m.get("decode_tok_s_busy")
            print(f"  round {k + 1} {system.name:<32} lat {m['mean_task_latency_s']:7.1f} s  "
                  f"ttft {m['mean_ttft_s']:6.2f} s  decode {m['decode_tok_s_makespan']:6.1f} / "
                  f"{'n/a' if busy is None else f'{busy:.1f}'} tok/s  hit {m['prefix_hit_rate']:.1%}  "
                  f"preempt {m['preemptions']}  errors {m['errors']}  [{time.monotonic() - t1:.0f} s wall]",
                  flush=True)
            plans = m.get("router_plans")
            if plans:
                print(f"          plans {plans['plans']}, age p50 {plans['age_p50_s']} s, p90 "
                      f"{plans['age_p90_s']} s (model); parts {plans['parts']}", flush=True)
    rows = table_rows(runs, failures | skipped)
    table = markdown_table(rows)
    print()
    print(table)
    print()
    print(verdict(runs))
    for name, why in (failures | skipped).items():
        print(f"{name}: {why}")
    wall = time.monotonic() - t0
    print(f"wall {wall / 60:.1f} min")
    if args.json_out:
        doc = {"config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
                          if k not in ("json_out", "system_list")}
               | {"systems": [s.name for s in systems], "log_dir": str(log_root), "cpus": os.cpu_count()},
               "peer_versions": versions, "runs": runs, "failures": failures, "skipped": skipped, "table": table,
               "verdict": verdict(runs), "wall_s": round(wall, 1)}
        args.json_out.write_text(json.dumps(doc, indent=2) + "\n")
    errors = sum(int(m["errors"]) for r in runs.values() for m in r)
    return 0 if errors == 0 and not failures else 1


if __name__ == "__main__":
    sys.exit(main())
