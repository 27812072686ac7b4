"""`tao tenants`: the budget service's tenants as an operator sees them, over its gRPC API.

- `tao tenants` prints the current allocation: per tenant its cap, admission limit and rate
  limits, the policy, the total and the last tick's decisions (`GetAllocation`);
- `tao tenants set --total B --tenant NAME[:FLOOR[:WEIGHT[:RPM[:TPM]]]] ...` replaces the tenant
  set (`ConfigureTenants`; the same form as `tao serve budget --tenant`, plus `--slo` and
  `--static-cap`) and prints the allocation it produced;
- `tao tenants policy static|dynamic` switches the policy (`SetPolicy`).

The address comes from `--budget` or `$TAO_BUDGET_ADDR` (default 127.0.0.1:50054, the port of
the compose file and the Kubernetes manifests), the token from `--token` or
`$TAO_BUDGET_ADMIN_TOKEN` / `$TAO_BUDGET_AUTH_TOKEN` (the admin RPCs need the admin token when
one is configured). Exit status: 0; 1 when the service answered an error (printed as one line,
e.g. `INVALID_ARGUMENT: floors sum to 10, above the total budget 8`); 2 when it could not be
reached.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Awaitable, Callable
from typing import TypeVar

import grpc
from google.protobuf import json_format

from services.budget.settings import TENANT_FORM, parse_tenant
from services.common.channels import add_tls_arguments, channel_from_args
from tao.budget.v1 import budget_pb2, budget_pb2_grpc

DEFAULT_BUDGET = "127.0.0.1:50054"
#: gRPC codes that mean "not reached" (exit 2) rather than "refused" (exit 1)
UNREACHABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
T = TypeVar("T")


def add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--budget", default=os.environ.get("TAO_BUDGET_ADDR", DEFAULT_BUDGET),
                        help=f"HOST:PORT of the budget service (default $TAO_BUDGET_ADDR or {DEFAULT_BUDGET})")
    parser.add_argument("--token", default=None,
                        help="bearer token (default $TAO_BUDGET_ADMIN_TOKEN, else $TAO_BUDGET_AUTH_TOKEN)")
    parser.add_argument("--json", action="store_true", help="print the service's answer as JSON")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds")
    add_tls_arguments(parser)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common(parser)


def call(args: argparse.Namespace, rpc: Callable[[budget_pb2_grpc.BudgetServiceStub], Awaitable[T]]) -> T:
    """One RPC on a fresh channel; ``grpc.aio.AioRpcError`` propagates to ``report``."""
    token = args.token or os.environ.get("TAO_BUDGET_ADMIN_TOKEN") or os.environ.get("TAO_BUDGET_AUTH_TOKEN")

    async def go() -> T:
        async with channel_from_args(args.budget, args, token) as channel:
            return await rpc(budget_pb2_grpc.BudgetServiceStub(channel))

    return asyncio.run(go())


def report(exc: grpc.aio.AioRpcError, prog: str) -> int:
    print(f"{prog}: {exc.code().name}: {exc.details()}", file=sys.stderr)
    return 2 if exc.code() in UNREACHABLE else 1


def table(alloc: budget_pb2.Allocation) -> str:
    """The allocation as an operator reads it: one row per tenant, then the last decisions."""
    head = (f"policy {alloc.policy or '-'}   total {alloc.total}   "
            f"revision {alloc.revision.epoch}/{alloc.revision.revision}")
    header = ("TENANT", "CAP", "LIMIT", "RPM", "TPM")
    rows = [header]
    for name in sorted(alloc.caps):
        limit = alloc.rate_limits.get(name)
        rows.append((name, str(alloc.caps[name]), str(alloc.limits.get(name, alloc.caps[name])),
                     str(limit.rpm) if limit is not None and limit.rpm else "-",
                     str(limit.tpm) if limit is not None and limit.tpm else "-"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = [head, ""] + ["   ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    if alloc.decisions:
        lines.append("")
        lines += [f"{d.kind}: {d.reason}" for d in alloc.decisions]
    return "\n".join(lines)


def show(args: argparse.Namespace, alloc: budget_pb2.Allocation) -> None:
    if args.json:
        print(json.dumps(json_format.MessageToDict(alloc, preserving_proto_field_name=True), indent=2))
    else:
        print(table(alloc))


def run(args: argparse.Namespace) -> int:
    try:
        reply = call(args, lambda stub: stub.GetAllocation(budget_pb2.GetAllocationRequest(), timeout=args.timeout))
    except grpc.aio.AioRpcError as exc:
        return report(exc, "tao tenants")
    show(args, reply.allocation)
    return 0


# ------------------------------------------------------------------ tao tenants set

def _assignment(kind: Callable[[str], T], what: str) -> Callable[[str], tuple[str, T]]:
    def parse(spec: str) -> tuple[str, T]:
        name, sep, value = spec.partition("=")
        try:
            if not sep or not name:
                raise ValueError(spec)
            return name, kind(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected NAME={what}, got {spec!r}") from None
    return parse


def add_set_arguments(parser: argparse.ArgumentParser) -> None:
    add_common(parser)
    parser.add_argument("--total", type=int, required=True, help="the total budget B (slots)")
    parser.add_argument("--tenant", action="append", type=parse_tenant, required=True, metavar=TENANT_FORM,
                        help="a tenant (repeat); the set replaces the configured one")
    parser.add_argument("--slo", action="append", type=_assignment(float, "SECONDS"), default=[],
                        metavar="NAME=SECONDS", help="a tenant's p99 latency objective (repeat)")
    parser.add_argument("--static-cap", action="append", type=_assignment(int, "SLOTS"), default=[],
                        metavar="NAME=SLOTS", help="a tenant's cap under the static policy (all or none)")


def configure_request(args: argparse.Namespace) -> budget_pb2.ConfigureTenantsRequest:
    """The request ``tao tenants set`` sends; ``ValueError`` for an option naming no tenant."""
    names = {t.name for t in args.tenant}
    slo, static = dict(args.slo), dict(args.static_cap)
    unknown = sorted((set(slo) | set(static)) - names)
    if unknown:
        raise ValueError(f"--slo / --static-cap name tenants not given with --tenant: {', '.join(unknown)}")
    return budget_pb2.ConfigureTenantsRequest(total_budget=args.total, tenants=[
        budget_pb2.TenantConfig(name=t.name, floor=t.floor, weight=t.weight, p99_slo_s=slo.get(t.name, 0.0),
                                static_cap=static.get(t.name, 0),
                                rate_limit=budget_pb2.RateLimit(rpm=t.rpm, tpm=t.tpm))
        for t in args.tenant
    ])


def run_set(args: argparse.Namespace) -> int:
    try:
        request = configure_request(args)
    except ValueError as exc:
        print(f"tao tenants set: {exc}", file=sys.stderr)
        return 2
    try:
        reply = call(args, lambda stub: stub.ConfigureTenants(request, timeout=args.timeout))
    except grpc.aio.AioRpcError as exc:
        return report(exc, "tao tenants set")
    show(args, reply.allocation)
    return 0


# ------------------------------------------------------------------ tao tenants policy

def add_policy_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("policy", help="static | dynamic")
    add_common(parser)


def run_policy(args: argparse.Namespace) -> int:
    try:
        reply = call(args, lambda stub: stub.SetPolicy(budget_pb2.SetPolicyRequest(policy=args.policy),
                                                      timeout=args.timeout))
    except grpc.aio.AioRpcError as exc:
        return report(exc, "tao tenants policy")
    print(json.dumps({"policy": reply.policy}) if args.json else f"policy {reply.policy}")
    return 0
