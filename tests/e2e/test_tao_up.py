"""`tao up` end to end: a short workload under TAO and a baseline produces a complete report;
SIGTERM stops the stack and leaves no child process behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

TAO = [sys.executable, "-m", "services.cli"]
METRICS = {"mean_task_latency_s", "p90_task_latency_s", "mean_ttft_s", "mean_ttft_after_tool_s",
           "decode_tok_s_makespan", "decode_tok_s_busy", "prefix_hit_rate", "mean_pause_wait_s", "preemptions",
           "completed_sessions", "latency_over_lower_bound", "latency_over_capacity_bound", "busy_over_work_bound"}


def _children(pid: int) -> set[int]:
    """All live descendants of ``pid`` (walks /proc)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    out, frontier = set(), {pid}
    while frontier:
        nxt = {p for p, pp in parents.items() if pp in frontier} - out
        out |= nxt
        frontier = nxt
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.slow
def test_tao_up_short_workload_writes_a_complete_report(tmp_path: Path) -> None:
    report = tmp_path / "report"
    out = subprocess.run(
        [*TAO, "up", "--sessions", "4", "--replicas", "2", "--time-scale", "50", "--workload", "swe-lite",
         "--compare", "round_robin", "--report", str(report), "--seed", "3"],
        capture_output=True, text=True, timeout=240, cwd=tmp_path,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    summary = json.loads((report / "summary.json").read_text())
    assert set(summary["policies"]) == {"tao", "round_robin"}
    for name, metrics in summary["policies"].items():
        assert METRICS <= set(metrics), name
        assert metrics["completed_sessions"] == 4 and metrics["errors"] == 0, (name, metrics)
        assert metrics["decode_tok_s_makespan"] > 0 and metrics["mean_ttft_s"] > 0
        # busy time from the emulated replicas' counter: Σ busy <= replicas x makespan
        assert metrics["decode_tok_s_busy"] >= metrics["decode_tok_s_makespan"] / 2
        assert metrics["latency_over_lower_bound"] >= 1.0
        assert metrics["latency_over_capacity_bound"] >= 1.0 and metrics["busy_over_work_bound"] >= 1.0
    assert "tao vs round_robin" in summary["comparison"]
    assert summary["capacity_bound"]["mean_task_latency_s"] >= summary["lower_bound"]["mean_task_latency_s"]
    assert summary["lower_bound"]["sessions"] == 4 and summary["lower_bound"]["mean_task_latency_s"] > 0
    for name in ("index.html", "latency_cdf.png", "throughput.png", "hit_rate.png", "trace.jsonl"):
        assert (report / name).stat().st_size > 0, name
    assert "data:image/png;base64," in (report / "index.html").read_text()
    # the Grafana dashboard's panels as PNGs (services/up/panels.py), per policy
    for policy in ("tao", "round_robin"):
        pngs = sorted((report / "panels").glob(f"panel-{policy}-*.png"))
        assert len(pngs) == 7 and all(p.stat().st_size > 0 for p in pngs), pngs
    assert "panel-tao-1-sessions" in (report / "index.html").read_text()
    assert "TAO vs baseline" in out.stdout
    leftovers = sorted(p.name for p in tmp_path.iterdir() if p.name != "report")
    assert leftovers == [], f"files outside the report folder: {leftovers}"


@pytest.mark.slow
def test_sigterm_stops_everything_without_orphans(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [*TAO, "up", "--no-workload", "--replicas", "2", "--report", str(tmp_path / "r")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path,
    )
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 120
        lines = []
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if "Ctrl-C to stop" in line:
                break
        assert any("router (OpenAI API):" in ln for ln in lines), "".join(lines)
        url = next(ln for ln in lines if "router (OpenAI API):" in ln).split(":", 1)[1].strip()
        import urllib.request

        with urllib.request.urlopen(url.removesuffix("/v1") + "/v1/models", timeout=5) as resp:
            assert resp.status == 200
        # the replica URLs (the driver's --replica, for preemptions) are printed too
        start = next(i for i, ln in enumerate(lines) if ln.startswith("replicas (vLLM API"))
        replicas = [ln.strip() for ln in lines[start + 1:] if ln.strip().startswith("http://")]
        assert len(replicas) == 2, "".join(lines)
        for replica in replicas:
            with urllib.request.urlopen(replica + "/metrics", timeout=5) as resp:
                assert resp.status == 200 and b"vllm:num_preemptions" in resp.read()
        # the budget's tenants, from the address the banner prints (`tao tenants`)
        budget = next(ln for ln in lines if ln.startswith("budget (gRPC):")).split()[2]
        tenants = subprocess.run([*TAO, "tenants", "--budget", budget], capture_output=True, text=True, timeout=60)
        assert tenants.returncode == 0 and tenants.stdout.startswith("policy "), tenants.stdout + tenants.stderr
        assert any(row.split()[:1] == ["default"] for row in tenants.stdout.splitlines()), tenants.stdout
        kids = _children(proc.pid)
        assert len(kids) >= 7, f"expected redis, 4 services and 2 replicas, found {len(kids)}"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) in (0, 130, 143)
        time.sleep(0.5)
        survivors = [k for k in kids if _alive(k)]
        assert survivors == [], f"orphans: {survivors}"
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
