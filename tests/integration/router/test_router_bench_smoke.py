"""bench.router runs end to end with minimal sizes (processes, figures, JSON)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from services.common.testing import find_redis_binary


@pytest.mark.skipif(find_redis_binary() is None, reason="needs a redis-server binary")
def test_bench_router_smoke(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    result = subprocess.run(
        [sys.executable, "-m", "bench.router", "--quick", "--levels", "1,4", "--requests-per-stream", "2",
         "--sat-streams", "4", "--tokens", "4", "--time-scale", "20", "--also-policies", "round_robin", "--json", str(out)],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "added" in result.stdout and "sustained" in result.stdout and "machine:" in result.stdout
    figures = json.loads(out.read_text())
    level = figures["levels"]["4"]
    assert level["router"]["requests"] == 8 and level["router"]["errors"] == 0
    assert level["direct"]["requests"] == 8 and level["router"]["chunks_per_s"] > 0
    assert figures["sustained"]["router"]["requests"] == 8
    assert level["tao:round_robin"]["requests"] == 8 and level["tao:round_robin"]["errors"] == 0
    assert "added_tao:round_robin" in level


def test_peer_ratios_and_the_64_stream_verdict() -> None:
    from bench.router.bench import _print_peer_ratios

    def stats(p50: float, cpu: float) -> dict[str, float]:
        return {"ttft_p50_ms": p50, "cpu_us_per_chunk": cpu}

    paths = ["direct", "router", "tao:round_robin", "vllm-router:round_robin"]
    figures = {"direct": stats(10.0, float("nan")), "router": stats(14.0, 26.0),
               "tao:round_robin": stats(13.0, 20.0), "vllm-router:round_robin": stats(12.0, 20.0)}
    out: dict[str, object] = {"added": {"ttft_p99_ms": 30.0, "ttft_p99_ms_rounds": [6.0, 9.0, 40.0]}}
    verdict: list[str] = []
    _print_peer_ratios(64, "closed", figures, out, paths, verdict)
    ratios = out["ratios"]
    assert isinstance(ratios, dict)
    assert ratios["router/vllm-router:round_robin"] == {"cpu_per_token": 1.3, "added_ttft_p50": 2.0}
    assert "MET" in verdict[0] and "NOT MET" not in verdict[0]  # 1.3x, 2.0x, median p99 9 ms
    assert "NOT MET" in verdict[1]  # 26 / 20 = 1.3x over TAO's own round_robin (limit 1.2x)
    # both routed paths faster than direct: no ratio; TAO's own 2 ms bound decides
    figures["vllm-router:round_robin"] = stats(9.0, 20.0)
    figures["router"] = stats(11.5, 26.0)
    verdict = []
    _print_peer_ratios(64, "closed", figures, out, paths, verdict)
    assert "NOT MET" not in verdict[0]
    figures["router"] = stats(12.5, 26.0)
    verdict = []
    _print_peer_ratios(64, "closed", figures, out, paths, verdict)
    assert "NOT MET" in verdict[0]


def test_the_fleet_benchmarks_floor_control_measures_its_load() -> None:
    """bench.router.fleet --controls: the plain proxy in front of a real emulated replica carries
    the closed-loop load, every request answered, and its CPU is read from /proc."""
    from bench.router.fleet import measure, start_control
    from bench.router.procs import start_replica

    replica = start_replica("qwen3-32b-h100x2", 50.0)
    try:
        proxy = start_control("floor", replica.url, None)
        try:
            ok, bad, wall, cpu, net = measure([proxy], 3, 2, "hash")
        finally:
            proxy.stop()
    finally:
        replica.stop()
    assert (ok, bad) == (6, 0)
    assert wall > 0 and cpu >= net >= 0
