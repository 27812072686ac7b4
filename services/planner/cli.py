"""`tao planner solve --snapshot F [--policy NAME]`: solve one snapshot, print the plan JSON
(formats: docs/architecture.md#snapshot-and-plan-json).

Exit codes: 0 solved; 2 bad input (unreadable file, invalid JSON, invalid snapshot, unknown
policy) with one line on stderr naming the problem. Nothing is published anywhere.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from services.planner.core import POLICIES, SnapshotError, UnknownPolicyError, make_policy
from services.planner.core.explain import explain
from services.planner.core.model import Snapshot
from services.planner.timing import timed_plan


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--snapshot", required=True, metavar="FILE",
                        help="snapshot JSON (docs/architecture.md#snapshot-and-plan-json); '-' reads standard input")
    parser.add_argument("--policy", default="tao",
                        help=f"registered policy (default tao): {', '.join(sorted(POLICIES))}")
    parser.add_argument("--engine-profile", default=None,
                        help="engine profile whose prefill/decode time fits the policy uses (default: qwen3-32b-h100x2's)")
    parser.add_argument("--explain", metavar="SESSION", action="append", default=[],
                        help="also explain why SESSION is (not) admitted (repeatable)")
    parser.add_argument("--compact", action="store_true", help="print the plan on one line")


def _fail(message: str) -> int:
    print(f"tao planner solve: {message}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    source = "<stdin>" if args.snapshot == "-" else args.snapshot
    try:
        text = sys.stdin.read() if args.snapshot == "-" else open(args.snapshot, encoding="utf-8").read()
    except OSError as exc:
        return _fail(f"cannot read {source}: {exc.strerror or exc}")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        return _fail(f"{source} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}")
    try:
        snapshot = Snapshot.from_json(data)
    except SnapshotError as exc:
        return _fail(f"bad snapshot {source}: {exc}")
    try:
        policy = make_policy(args.policy, engine_profile=args.engine_profile)
    except (UnknownPolicyError, ValueError) as exc:
        return _fail(str(exc))
    plan = timed_plan(policy, snapshot)
    out: dict[str, Any] = plan.to_json()
    if args.explain:
        known = {s.id for s in snapshot.sessions}
        missing = [sid for sid in args.explain if sid not in known]
        if missing:
            return _fail(f"--explain: no session {missing[0]!r} in {source}")
        out["explanations"] = [
            {
                "session": e.session,
                "admitted": e.admitted,
                "replica": e.replica,
                "reason": e.reason,
                "values": [
                    {"replica": v.replica, "credit_tokens": v.credit_tokens, "free_tokens": v.free_tokens,
                     "eligible": v.eligible}
                    for v in e.values
                ],
            }
            for e in (explain(snapshot, plan, sid) for sid in args.explain)
        ]
    json.dump(out, sys.stdout, indent=None if args.compact else 2)
    sys.stdout.write("\n")
    return 0
