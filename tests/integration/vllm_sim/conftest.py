"""Fixtures: an in-process emulated replica (async tests) and a `tao vllm-sim` subprocess."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from services.sim.vllm_sim.server import RunningSim, start_vllm_sim

FAST = 2000.0  # model time 2000x faster than wall time keeps tests quick
REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
async def sim() -> AsyncIterator[RunningSim]:
    async with start_vllm_sim("qwen3-32b-h100x2", port=0, time_scale=FAST, max_model_len=32768) as s:
        yield s


@dataclass
class SimProcess:
    proc: subprocess.Popen[str]
    base_url: str


def spawn_sim(*extra: str) -> SimProcess:
    proc = subprocess.Popen(
        [sys.executable, "-m", "services.cli", "vllm-sim", "--port", "0", *extra],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    m = re.fullmatch(r"vllm-sim listening on (http://[\d.]+:\d+)\n", line)
    if m is None:
        proc.kill()
        raise AssertionError(f"unexpected first line {line!r}; stderr: {proc.stderr.read() if proc.stderr else ''}")
    return SimProcess(proc, m.group(1))


def stop_sim(p: SimProcess) -> int:
    p.proc.send_signal(signal.SIGTERM)
    return p.proc.wait(timeout=10)


@dataclass
class Spawner:
    spawn: Callable[..., SimProcess]
    stop: Callable[[SimProcess], int]


@pytest.fixture
def sim_spawner() -> Spawner:
    return Spawner(spawn_sim, stop_sim)


@pytest.fixture(scope="module")
def sim_process() -> Iterator[SimProcess]:
    p = spawn_sim("--time-scale", str(FAST), "--model-name", "tao-test-model", "--max-model-len", "8192")
    try:
        yield p
    finally:
        if p.proc.poll() is None:
            stop_sim(p)
