"""Processes of the router benchmark: Redis, one emulated replica, the router; CPU times."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from bench.peers.core import System, router_argv
from services.up.stack import http_ok

CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


class Proc:
    """A child process whose output is scanned for a line announcing its URL, or (``ready_url``)
    that is ready once ``ready_url`` answers HTTP 200 (a peer router that logs no URL)."""

    def __init__(self, args: list[str], marker: str | None, env: dict[str, str] | None = None,
                 timeout_s: float = 60.0, cwd: str | None = None, ready_url: str | None = None) -> None:
        self.args = args
        self.tao_metrics = ready_url is None  # a TAO router exposes tao_router_* metrics; peers do not
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=cwd,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
        self.url = ""
        self.tail: list[str] = []
        found = threading.Event()

        def pump() -> None:
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                self.tail = (self.tail + [line.rstrip()])[-20:]
                if marker is not None and not found.is_set() and marker in line:
                    self.url = line.strip().rsplit(" ", 1)[-1]
                    found.set()

        threading.Thread(target=pump, daemon=True).start()
        deadline = time.monotonic() + timeout_s
        if ready_url is not None:
            self.url = ready_url.rsplit("/", 1)[0]
        while not found.wait(0.1) and not (ready_url is not None and http_ok(ready_url)):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{args[3:5]} did not start:\n" + "\n".join(self.tail))

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


def start_vllm_router(bin_dir: str, replica_url: str, system: System, port: int, metrics_port: int) -> Proc:
    """vLLM's Rust router (``vllm-router`` from PyPI, installed by ``bench.peers`` into its own
    venv) in front of the replica, started as ``bench.peers`` starts it; ready when its /health
    answers."""
    argv = router_argv(system, bin_dir, port, [replica_url], metrics_port)
    return Proc(argv, None, ready_url=f"http://127.0.0.1:{port}/health")


def vllm_router_bin(venv: str | None) -> tuple[str | None, str]:
    """(the bin dir of the peers' venv with ``vllm-router``, its version), or (None, why not):
    ``bench.peers`` creates that venv and installs the router there from PyPI, never into this
    package's environment."""
    from bench.peers.__main__ import DEFAULT_VENV, ensure_peers

    bin_dir, versions, failed = ensure_peers(Path(venv) if venv else DEFAULT_VENV, {"vllm-router": "vllm-router"})
    if failed:
        return None, failed["vllm-router"]
    return bin_dir, versions["vllm-router"]


def start_replica(profile: str, time_scale: float) -> Proc:
    return Proc([sys.executable, "-m", "services.cli", "vllm-sim", "--port", "0", "--profile", profile,
                 "--time-scale", str(time_scale)], "vllm-sim listening on")


def start_router(redis_url: str, replica_url: str, policy: str, src: str | None = None) -> Proc:
    """The router of this checkout, or of the source tree ``src`` (an A/B baseline, e.g. a
    ``git archive`` of another commit: it runs with ``src`` as its working directory and
    first on its path, against the same replica, Redis and load)."""
    env = {"TAO_ROUTER_HOLD_TIMEOUT_S": "120", "TAO_ROUTER_LOG_FORMAT": "console"}
    if src is not None:
        src = str(Path(src).resolve())
        if not (Path(src) / "services" / "router").is_dir():
            raise SystemExit(f"--baseline-src {src}: no services/router there")
        env["PYTHONPATH"] = src
    return Proc([sys.executable, "-m", "services.cli", "serve", "router", "--redis-url", redis_url, "--port", "0",
                 "--http-port", "0", "--replica", replica_url, "--policy", policy, "--log-level", "warning"],
                "tao router gateway on", env=env, cwd=src)
