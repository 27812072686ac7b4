"""`tao check faults`: inject faults into a freshly started stack under an agent workload,
throw bad input at every endpoint, and summarise: faults injected / survived, bad inputs
tried / rejected cleanly / crashes, requests lost, requests duplicated.

The scenarios are ``bench.faults.scenarios`` and the bad inputs ``bench.faults.badinput``,
the same code the CI suites (tests/faults, tests/badinput) run. Exit status 0 only when every
fault was survived and nothing was lost, duplicated or crashed.

``--fleet`` runs the fleet suite instead (``bench.faults.fleet_cli``): 3 routers, 2 planners,
2 budget services and a Redis Cluster, with kill -9 of the leader planner, a Redis master, a
router and the leader budget service.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.faults.env import MODEL, EnvConfig, FaultEnv
from bench.faults.scenarios import SCENARIOS, ScenarioResult, stop_planner
from services.common import keys
from services.common.extras import require

BODY_LIMIT = 1 << 20


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from bench.faults import fleet_cli

    parser.add_argument("--scenarios", default=None,
                        help=f"comma-separated subset of: {', '.join(SCENARIOS)} (default all); with --fleet: "
                             f"{', '.join(fleet_cli.FLEET_NAMES)}")
    parser.add_argument("--stop-s", type=float, default=10.0, help="how long the planner is SIGSTOPped")
    parser.add_argument("--examples", type=int, default=25,
                        help="hypothesis examples per gRPC RPC and kind (arbitrary, near-valid)")
    parser.add_argument("--no-bad-input", action="store_true", help="skip the bad-input part")
    parser.add_argument("--no-faults", action="store_true", help="skip the fault scenarios")
    parser.add_argument("--time-scale", type=float, default=20.0, help="model seconds per wall second")
    parser.add_argument("--logs", type=Path, default=None, help="keep the services' logs in this folder")
    parser.add_argument("--json", type=Path, default=None, help="write every result as JSON here")
    parser.add_argument("-v", "--verbose", action="store_true", help="print every check")
    fleet_cli.add_arguments(parser)


def _scenario_line(res: ScenarioResult) -> str:
    mark = "ok  " if res.ok else "FAIL"
    failed = [c.name for c in res.checks if not c.ok]
    line = (f"  [{mark}] {res.name:<15} faults {res.faults}  requests {res.load.get('requests', 0):>4}  "
            f"lost {res.lost}  duplicated {res.duplicated}  ({res.wall_s:.1f} s)")
    if failed:
        line += "\n         failed: " + "; ".join(failed)
    return line


def _run_faults(args: argparse.Namespace, names: list[str]) -> list[ScenarioResult]:
    cfg = EnvConfig(time_scale=args.time_scale, log_dir=args.logs / "faults" if args.logs else None)
    env = FaultEnv(cfg)
    results: list[ScenarioResult] = []
    try:
        print(f"starting the stack (redis, router, planner, predictor, budget, {cfg.replicas} replicas) ...",
              flush=True)
        env.start()
        for name in names:
            env.heal()
            asyncio.run(env.wait_serving(timeout_s=20))
            if name == "stop_planner":
                res = asyncio.run(stop_planner(env, stop_s=args.stop_s))
            else:
                res = asyncio.run(SCENARIOS[name](env))
            if env.dead():
                res.check("no process died", False, env.dead())
            results.append(res)
            print(_scenario_line(res), flush=True)
            if args.verbose:
                for c in res.checks:
                    print(f"         {'pass' if c.ok else 'FAIL'} {c.name}" + ("" if c.ok else f": {c.detail[:200]}"))
                for note in res.notes:
                    print(f"         note: {note}")
    finally:
        env.stop()
    return results


def _run_bad_input(args: argparse.Namespace) -> dict[str, Any]:
    import httpx

    from bench.faults import badinput

    env_vars = {**EnvConfig().env, "TAO_ROUTER_MAX_BODY_BYTES": str(BODY_LIMIT)}
    cfg = EnvConfig(replicas=1, time_scale=args.time_scale, hold_timeout_s=20.0, env=env_vars,
                    log_dir=args.logs / "bad-input" if args.logs else None)
    env = FaultEnv(cfg)
    parts: dict[str, badinput.Tally] = {}
    try:
        print("starting a fresh stack for bad input ...", flush=True)
        env.start()
        redis = env.redis()
        with httpx.Client(base_url=env.addr.router_url, timeout=60) as http:
            def router_probe() -> Any:
                health = http.get("/health").json()
                return health["sessions"], health["held_requests"], sorted(redis.hkeys(keys.SESSIONS))

            parts["router HTTP"] = badinput.Tally()
            badinput.run_http(http, badinput.router_cases(MODEL, BODY_LIMIT), parts["router HTTP"], router_probe,
                              settle_s=0.1)
        with httpx.Client(base_url=env.addr.replicas[0], timeout=60) as http:
            parts["replica HTTP"] = badinput.Tally()
            badinput.run_http(http, badinput.replica_cases(MODEL), parts["replica HTTP"])
        addresses = {"planner": env.addr.planner, "predictor": env.addr.predictor, "budget": env.addr.budget,
                     "router": env.addr.router_admin}
        for service in addresses:
            parts[f"{service} gRPC"] = badinput.Tally()
            badinput.fuzz_all(addresses, redis, args.time_scale, args.examples, parts[f"{service} gRPC"],
                              only=service)
        status = asyncio.run(env.wait_serving(timeout_s=10))
        dead = env.dead()
    finally:
        env.stop()
    for name, t in parts.items():
        print(f"  {name:<15} tried {t.tried:>5}  rejected cleanly {t.rejected:>5}  valid {t.accepted:>4}  "
              f"crashes {t.crashes}  wrong answer {t.unexpected}  state changed {t.state_changes}", flush=True)
        for problem in t.problems[:8]:
            print(f"         {problem[:220]}")
    total = badinput.Tally()
    for t in parts.values():
        total.merge(t)
    not_serving = [n for n, s in status.items() if s != "SERVING"]
    total.crashes += len(set(dead) | set(not_serving))
    return {"total": asdict(total), "parts": {k: asdict(v) for k, v in parts.items()}, "dead": dead,
            "not_serving": not_serving}


def run(args: argparse.Namespace) -> int:
    if args.fleet:
        from bench.faults import fleet_cli

        return fleet_cli.run(args)
    names = [n.strip() for n in (args.scenarios or ",".join(SCENARIOS)).split(",") if n.strip()]
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        print(f"tao check faults: unknown scenario(s) {unknown}; known: {', '.join(SCENARIOS)}", file=sys.stderr)
        return 2
    if not args.no_bad_input:  # before any stack starts, not after the fault scenarios
        require("faults", "the gRPC fuzzing of the bad-input part; --no-bad-input skips it")
    started = time.monotonic()
    print(f"tao check faults — {os.cpu_count()} CPUs, Python {platform.python_version()}, "
          f"time scale {args.time_scale:g}")
    results: list[ScenarioResult] = []
    bad: dict[str, Any] | None = None
    try:
        if not args.no_faults:
            print("fault scenarios:")
            results = _run_faults(args, names)
        if not args.no_bad_input:
            print("bad input:")
            bad = _run_bad_input(args)
    except RuntimeError as exc:  # the stack did not start
        print(f"tao check faults: {exc}", file=sys.stderr)
        return 1
    injected = sum(r.faults for r in results)
    survived = sum(r.faults for r in results if r.ok)
    attempts = sum(sum(v for k, v in r.load.items() if k.startswith("attempts_")) for r in results)
    requests = sum(r.load.get("requests", 0) for r in results)
    lost = sum(r.lost for r in results)
    duplicated = sum(r.duplicated for r in results)
    replays = sum(r.replays for r in results)
    print()
    print("summary")
    if results:
        print(f"  faults injected / survived     {injected} / {survived}   "
              f"({sum(r.ok for r in results)} of {len(results)} scenarios passed every check)")
        print(f"  requests                       {requests} ({attempts} attempts incl. client retries)")
        print(f"  requests lost                  {lost}")
        print(f"  requests duplicated            {duplicated}"
              + (f"   (+{replays} computed again for a router that had failed them over; answered once)"
                 if replays else ""))
    if bad is not None:
        t = bad["total"]
        print(f"  bad inputs tried / rejected cleanly / crashes   {t['tried']} / {t['rejected']} / {t['crashes']}"
              f"   (valid after all {t['accepted']}, wrong answer {t['unexpected']}, "
              f"state changed {t['state_changes']})")
    print(f"  wall time                      {time.monotonic() - started:.0f} s")
    if args.json is not None:
        args.json.write_text(json.dumps({
            "scenarios": [asdict(r) for r in results], "bad_input": bad,
            "summary": {"faults_injected": injected, "faults_survived": survived, "requests": requests,
                        "lost": lost, "duplicated": duplicated, "replays": replays},
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        }, indent=2))
    ok = all(r.ok for r in results) and lost == 0 and duplicated == 0
    if bad is not None:
        t = bad["total"]
        ok = ok and t["crashes"] == 0 and t["unexpected"] == 0 and t["state_changes"] == 0
    return 0 if ok else 1
