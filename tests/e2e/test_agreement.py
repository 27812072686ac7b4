"""`python -m bench.agreement`: one trace through the simulator and a live stack per policy;
the JSON holds both results, the gaps and the rankings, and the live runs finish cleanly."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.agreement.compare import COMPARED

CMD = [sys.executable, "-m", "bench.agreement"]


@pytest.mark.timeout(240)
def test_agreement_small_trace(tmp_path: Path) -> None:
    out = tmp_path / "agree.json"
    proc = subprocess.run(CMD + ["--kind", "chat-bursty", "--sessions", "3", "--concurrency", "3",
                                 "--policies", "tao,round_robin", "--time-scale", "40", "--json", str(out),
                                 "--log-dir", str(tmp_path / "logs")],
                          capture_output=True, text=True, timeout=230)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert set(doc["sim"]["policies"]) == set(doc["live"]) == {"tao", "round_robin"}
    for policy, live in doc["live"].items():
        assert live["errors"] == 0
        assert live["completed_sessions"] == doc["sim"]["policies"][policy]["completed_sessions"] == 3
        # the same trace on the same engine model: task latency within a factor of two
        # (live adds wall-clock overhead x time scale; CI machines are loaded)
        assert 0.5 < live["mean_task_latency_s"] / doc["sim"]["policies"][policy]["mean_task_latency_s"] < 2.0
    assert [a["metric"] for a in doc["agreement"]] == list(COMPARED)
    for a in doc["agreement"]:
        assert sorted(a["sim_order"]) == sorted(a["e2e_order"]) == ["round_robin", "tao"]
        assert a["kendall_tau"] in (1.0, -1.0)
        assert a["same_order"] == (a["kendall_tau"] == 1.0) == (not a["discordant_pairs"])
    assert (tmp_path / "logs" / "trace.jsonl").exists()
    assert "Kendall tau" in proc.stdout


def test_agreement_rejects_the_oracle_and_bad_sizes() -> None:
    for extra in (["--policies", "tao,oracle"], ["--policies", "tao"], ["--sessions", "0"],
                  ["--profile", "nope"], ["--time-scale", "-1"]):
        proc = subprocess.run(CMD + extra, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2, (extra, proc.stderr)
        assert "error:" in proc.stderr
