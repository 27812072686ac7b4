"""`tao tenants`, `tao tenants set` and `tao tenants policy` against the real budget service over
loopback gRPC (the console script's own entry point, run in a worker thread while the service
runs in the test's event loop): what they print, their exit codes, the admin token, and that a
refused configuration changes nothing."""

from __future__ import annotations

import asyncio
import json
import re
import time

import pytest
import redis.asyncio as aioredis

from services.budget.server import BudgetApp, Settings
from services.cli import main
from services.common import keys
from services.common.clock import VirtualClock
from services.common.records import BudgetConfigRecord, load
from services.common.settings import load_settings
from services.common.testing import serve_in_process

TOKEN = "admin-secret"


LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \[")  # the in-process service's own log lines


async def tao(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """Run the console script; (exit code, stdout, stderr) without the service's log lines."""
    code = await asyncio.to_thread(main, list(argv))
    out, err = capsys.readouterr()
    keep = lambda text: "".join(line for line in text.splitlines(keepends=True) if not LOG_LINE.match(line))  # noqa: E731
    return code, keep(out), keep(err)


async def test_tenants_set_show_and_policy(redis_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    settings = load_settings(Settings, redis_url=redis_url, port=0, redis_startup_timeout_s=2.0, admin_token=TOKEN)
    app = BudgetApp(settings, clock=VirtualClock(time.time()), to_unix=lambda t: t, autotick=False)
    redis = aioredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        async with serve_in_process("budget", app, settings) as running:
            addr = ("--budget", running.address)
            code, _, err = await tao(capsys, "tenants", *addr)
            assert code == 1 and "NOT_FOUND" in err  # nothing configured yet

            set_args = ("tenants", "set", *addr, "--total", "8", "--tenant", "A:1:1:600:200000",
                        "--tenant", "B:1", "--slo", "A=2.5")
            code, _, err = await tao(capsys, *set_args)
            assert code == 1 and "UNAUTHENTICATED" in err  # an admin RPC without the token

            code, out, _ = await tao(capsys, *set_args, "--token", TOKEN)
            assert code == 0, out
            lines = out.splitlines()
            assert lines[0].startswith("policy dynamic   total 8")
            assert lines[2].split() == ["TENANT", "CAP", "LIMIT", "RPM", "TPM"]
            assert lines[3].split() == ["A", "4", "4", "600", "200000"]
            assert lines[4].split() == ["B", "4", "4", "-", "-"]
            stored = load(BudgetConfigRecord, await redis.get(keys.BUDGET_CONFIG))
            assert [(t.name, t.p99_slo_s, t.rate_limit.rpm) for t in stored.tenants] == [("A", 2.5, 600), ("B", 0.0, 0)]

            code, out, _ = await tao(capsys, "tenants", *addr, "--token", TOKEN, "--json")
            alloc = json.loads(out)
            assert code == 0 and alloc["caps"] == {"A": "4", "B": "4"}  # proto3 JSON: int64 as strings
            assert alloc["rate_limits"] == {"A": {"rpm": "600", "tpm": "200000"}}

            # refused by the service: one line, exit 1, the stored configuration unchanged
            code, _, err = await tao(capsys, "tenants", "set", *addr, "--token", TOKEN, "--total", "8",
                                     "--tenant", "A:5", "--tenant", "B:5")
            assert code == 1 and "INVALID_ARGUMENT: floors sum to 10, above the total budget 8" in err
            assert load(BudgetConfigRecord, await redis.get(keys.BUDGET_CONFIG)) == stored
            # refused before sending: an option naming no tenant (exit 2, as a usage error)
            code, _, err = await tao(capsys, "tenants", "set", *addr, "--token", TOKEN, "--total", "8",
                                     "--tenant", "A", "--slo", "C=1")
            assert code == 2 and "C" in err

            code, out, _ = await tao(capsys, "tenants", "policy", "static", *addr, "--token", TOKEN)
            assert code == 0 and out.strip() == "policy static"
            code, _, err = await tao(capsys, "tenants", "policy", "greedy", *addr, "--token", TOKEN)
            assert code == 1 and "INVALID_ARGUMENT" in err
    finally:
        await redis.aclose()
    code, _, err = await tao(capsys, "tenants", *addr, "--timeout", "2")
    assert code == 2 and "UNAVAILABLE" in err  # the service is gone: not reached
