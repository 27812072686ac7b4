"""`tao check faults --fleet` (also ``python -m bench.faults --fleet``): the fleet fault suite.

Starts the fleet on loopback (``bench.faults.fleet_env``: a Redis Cluster of 3 masters with a
replica each, 3 routers, 2 planners, 2 budget services, the predictor, emulated replicas) and
runs each scenario of ``bench.faults.scenarios_fleet`` under an agent workload, healing the
fleet in between (killed processes restarted, killed Redis nodes rejoined). Prints one row
per scenario: requests, lost, duplicated, stuck sessions, the recovery times, and a summary;
``--json OUT`` writes every result. Exit status 0 only when every check of every scenario
passed and nothing was lost, duplicated or left stuck.
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
from typing import Any

from bench.faults.outcome import ScenarioResult

FLEET_NAMES = ("kill_planner", "kill_redis_master", "kill_router", "kill_budget")
RECOVERY_ORDER = ("standby_leads", "replica_promoted", "member_expired", "sessions_continued", "plan_published",
                  "caps_published", "routers_applied", "max_gap")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("fleet suite (--fleet)")
    group.add_argument("--fleet", action="store_true",
                       help="run the fleet suite: 3 routers, 2 planners, 2 budget services, a Redis Cluster; "
                            f"kill -9 of {', '.join(FLEET_NAMES)}")
    group.add_argument("--routers", type=int, default=3, help="routers in the fleet")
    group.add_argument("--agents", type=int, default=6, help="concurrent agents of the workload")
    group.add_argument("--turns", type=int, default=6, help="LLM calls per session")
    group.add_argument("--spread", choices=("hash", "round_robin"), default="hash",
                       help="how the workload (standing in for an L7 balancer) picks a router: the session's "
                            "hash (ring-hash on x-session-id) or the next router per request")
    group.add_argument("--no-router-fleet", action="store_true",
                       help="run the routers without fleet mode (independent routers on one Redis)")


def _fmt_recovery(rec: dict[str, float]) -> str:
    keys = [k for k in RECOVERY_ORDER if k in rec] + sorted(k for k in rec if k not in RECOVERY_ORDER)
    return ", ".join(f"{k} {rec[k]:.2f}" for k in keys)


def _row(res: ScenarioResult) -> str:
    mark = "ok  " if res.ok and not (res.lost or res.duplicated or res.stuck) else "FAIL"
    return (f"  {res.name:<18} {res.load.get('requests', 0):>8} {res.lost:>5} {res.duplicated:>5} {res.stuck:>6}   "
            f"{mark}  {_fmt_recovery(res.recovery_s)}")


def run(args: argparse.Namespace) -> int:
    from bench.faults.fleet_env import FleetConfig, FleetEnv
    from bench.faults.scenarios_fleet import FLEET_SCENARIOS

    names = [n.strip() for n in (args.scenarios or ",".join(FLEET_NAMES)).split(",") if n.strip()]
    unknown = [n for n in names if n not in FLEET_SCENARIOS]
    if unknown:
        print(f"tao check faults --fleet: unknown scenario(s) {unknown}; known: {', '.join(FLEET_SCENARIOS)}",
              file=sys.stderr)
        return 2
    if args.routers < 2 or args.agents < 1 or args.turns < 2:
        print("tao check faults --fleet: needs --routers >= 2, --agents >= 1, --turns >= 2", file=sys.stderr)
        return 2
    started = time.monotonic()
    cfg = FleetConfig(routers=args.routers, time_scale=args.time_scale, router_fleet=not args.no_router_fleet,
                      log_dir=args.logs / "fleet" if args.logs else None)
    env = FleetEnv(cfg)
    print(f"tao check faults --fleet — {os.cpu_count()} CPUs, Python {platform.python_version()}, "
          f"time scale {args.time_scale:g}")
    mode = "fleet mode" if env.router_fleet else "NOT in fleet mode (--no-router-fleet)"
    print(f"starting: Redis Cluster (3 masters + 3 replicas), {cfg.routers} routers ({mode}), {cfg.planners} planners, "
          f"{cfg.budgets} budget services, predictor, {cfg.replicas} emulated replicas ...", flush=True)
    results: list[ScenarioResult] = []
    try:
        env.start()
        print(f"  up in {time.monotonic() - started:.0f} s; workload: {args.agents} agents x {args.turns} turns, "
              f"spread {args.spread}")
        print(f"  {'scenario':<18} {'requests':>8} {'lost':>5} {'dup':>5} {'stuck':>6}   result  recovery (s after the kill)",
              flush=True)
        for name in names:
            env.heal()
            asyncio.run(env.wait_serving(45))
            res = asyncio.run(_scenario(FLEET_SCENARIOS[name], env, args))
            results.append(res)
            print(_row(res), flush=True)
            failed = [c for c in res.checks if not c.ok]
            for c in (res.checks if args.verbose else failed):
                print(f"      {'pass' if c.ok else 'FAIL'} {c.name}" + ("" if c.ok else f": {c.detail[:240]}"))
            if args.verbose or failed:
                for note in res.notes:
                    print(f"      note: {note}")
    except RuntimeError as exc:  # the fleet did not start
        print(f"tao check faults --fleet: {exc}", file=sys.stderr)
        return 1
    finally:
        env.stop()
    lost = sum(r.lost for r in results)
    dup = sum(r.duplicated for r in results)
    stuck = sum(r.stuck for r in results)
    passed = sum(r.ok for r in results)
    print()
    print("summary")
    print(f"  scenarios passed               {passed} of {len(results)}")
    print(f"  requests                       {sum(r.load.get('requests', 0) for r in results)}")
    print(f"  requests lost                  {lost}")
    print(f"  requests duplicated            {dup}")
    print(f"  sessions stuck                 {stuck}")
    print(f"  wall time                      {time.monotonic() - started:.0f} s")
    if args.json is not None:
        summary: dict[str, Any] = {"scenarios_passed": passed, "scenarios": len(results), "lost": lost,
                                   "duplicated": dup, "stuck": stuck, "router_fleet": env.router_fleet}
        args.json.write_text(json.dumps({
            "fleet": {"routers": cfg.routers, "planners": cfg.planners, "budgets": cfg.budgets,
                      "redis_cluster": "3 masters + 3 replicas", "lease_ttl_s": cfg.lease_ttl_s,
                      "member_ttl_s": cfg.member_ttl_s, "node_timeout_ms": cfg.node_timeout_ms,
                      "agents": args.agents, "turns": args.turns, "spread": args.spread},
            "scenarios": [asdict(r) for r in results], "summary": summary,
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        }, indent=2))
    ok = passed == len(results) and lost == 0 and dup == 0 and stuck == 0
    return 0 if ok else 1


async def _scenario(fn: Any, env: Any, args: argparse.Namespace) -> ScenarioResult:
    res: ScenarioResult = await fn(env, spread=args.spread, agents=args.agents, turns=args.turns)
    dead = env.dead()
    if dead:
        res.check("no process died", False, dead)
    return res
