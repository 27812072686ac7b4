"""`tao explain SESSION` and `tao sessions`: the router's operator view over HTTP
(``GET /v1/sessions/{id}``, ``GET /v1/sessions``).

The key comes from ``--api-key`` or ``TAO_API_KEY`` (a tenant's key sees its own sessions,
the router's admin token all of them; in dev mode none is needed). Exit status: 0, 1 when
the router answered an error (printed as one line), 2 when it could not be reached.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

DEFAULT_ROUTER = "http://127.0.0.1:8000"
COLUMNS = (("SESSION", "session"), ("TENANT", "tenant"), ("PHASE", "phase"), ("REPLICA", "replica"),
           ("FOOTPRINT", "footprint_tokens"), ("REQUESTS", "requests"), ("HELD", "held"), ("WAITING", "waiting_s"),
           ("AGE", "age_s"))


class RouterError(Exception):
    def __init__(self, message: str, unreachable: bool = False) -> None:
        super().__init__(message)
        self.unreachable = unreachable


def add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--router", default=os.environ.get("TAO_ROUTER_URL", DEFAULT_ROUTER),
                        help=f"router base URL (default $TAO_ROUTER_URL or {DEFAULT_ROUTER})")
    parser.add_argument("--api-key", default=None, help="tenant key or the router's admin token (default $TAO_API_KEY)")
    parser.add_argument("--tenant", default=None, help="dev mode: the x-tao-tenant header")
    parser.add_argument("--json", action="store_true", help="print the router's JSON answer")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds")


def get(args: argparse.Namespace, path: str) -> Any:
    headers = {"Accept": "application/json"}
    key = args.api_key or os.environ.get("TAO_API_KEY")
    if key:
        headers["Authorization"] = f"Bearer {key}"
    if args.tenant:
        headers["x-tao-tenant"] = args.tenant
    url = args.router.rstrip("/") + path
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=args.timeout) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        try:
            err = json.loads(exc.read())["error"]
            message = f"{exc.code} {err.get('code') or err.get('type')}: {err.get('message')}"
        except (ValueError, KeyError, TypeError):
            message = f"{exc.code} {exc.reason}"
        raise RouterError(message) from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise RouterError(f"cannot reach {url}: {getattr(exc, 'reason', exc)}", unreachable=True) from None


def table(rows: list[dict[str, Any]]) -> str:
    def cell(v: Any) -> str:
        if v is None:
            return "-"
        if isinstance(v, float):
            return f"{v:.1f}s"
        return str(v)

    grid = [[h for h, _ in COLUMNS]] + [[cell(r.get(k)) for _, k in COLUMNS] for r in rows]
    widths = [max(len(line[i]) for line in grid) for i in range(len(COLUMNS))]
    return "\n".join("   ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in grid)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("session", help="session id (x-session-id / program_id)")
    add_common(parser)


def run(args: argparse.Namespace) -> int:
    try:
        body = get(args, "/v1/sessions/" + urllib.parse.quote(args.session, safe=""))
    except RouterError as exc:
        print(f"tao explain: {exc}", file=sys.stderr)
        return 2 if exc.unreachable else 1
    if args.json:
        print(json.dumps(body, indent=2))
    else:
        print(body.get("text") or json.dumps(body, indent=2))
    return 0


def run_sessions(args: argparse.Namespace) -> int:
    query = {k: v for k, v in (("phase", args.phase), ("tenant", args.only_tenant)) if v}
    path = "/v1/sessions" + ("?" + urllib.parse.urlencode(query) if query else "")
    try:
        body = get(args, path)
    except RouterError as exc:
        print(f"tao sessions: {exc}", file=sys.stderr)
        return 2 if exc.unreachable else 1
    if args.json:
        print(json.dumps(body, indent=2))
    elif not body.get("data"):
        print("No sessions.")
    else:
        print(table(body["data"]))
    return 0
