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
         "--sat-streams", "4", "--tokens", "4", "--time-scale", "20", "--json", str(out)],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "added" in result.stdout and "sustained" in result.stdout and "machine:" in result.stdout
    figures = json.loads(out.read_text())
    level = figures["levels"]["4"]
    assert level["router"]["requests"] == 8 and level["router"]["errors"] == 0
    assert level["direct"]["requests"] == 8 and level["router"]["chunks_per_s"] > 0
    assert figures["sustained"]["router"]["requests"] == 8
