"""The planner benchmark runs end to end at minimal sizes (figures are not asserted)."""

from __future__ import annotations

from bench.planner.bench import SMOKE, run


def test_bench_runs_at_smoke_size() -> None:
    lines: list[str] = []
    result = run(SMOKE, echo=lines.append)
    assert result["small"]["dp-only"]["p99_ms"] > 0 and result["large"]["tao"]["solvers"] == ["knapsack+bfd"]
    assert 0.0 <= result["compare"]["sjf"]["dp_strictly_better_share"] <= 1.0
    assert result["compare"]["sjf"]["shipped_worse"] == 0 and result["compare"]["tao-bfd"]["shipped_worse"] == 0
    assert any("[3] random multi-candidate snapshots" in line for line in lines)
