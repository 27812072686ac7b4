"""The fast grid (``python -m bench.sim --fast``) mirrors the full grid, every session fits its
replica, and ``--agreement`` compares two grids' rankings. No simulation runs here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.sim.__main__ import main as bench_main
from bench.sim.agreement import grid_agreement
from bench.sim.grid import FAST_MAX_WAVES, FAST_POLICIES, FAST_SCALE, FAST_SUFFIX, GRID, fast_grid
from services.sim.workload.generate import GenerateOptions, generate
from services.sim.workload.trace import TraceSession


def test_fast_grid_mirrors_the_full_grid() -> None:
    fast = fast_grid()
    assert len(fast) == len(GRID) == 12
    for f, p in zip(fast, GRID, strict=True):
        assert f.key == p.key + FAST_SUFFIX
        assert (f.setup, f.profile, f.replicas, f.kind, f.ablation) == (p.setup, p.profile, p.replicas, p.kind,
                                                                       p.ablation)
        assert f.concurrency < p.concurrency and f.concurrency <= f.sessions < p.sessions
    # three concurrency levels per setup, ascending, the ablations at the middle one
    for i in range(0, 12, 3):
        levels = fast[i:i + 3]
        assert levels[0].concurrency < levels[1].concurrency < levels[2].concurrency
        assert [q.ablation for q in levels] == [False, True, False]
    assert set(FAST_POLICIES) == {"tao", "thunderagent", "thunderagent-reserved", "continuum", "continuum-affine", "sjf"}


def test_fast_grid_keeps_the_contention_ratio_and_the_waves() -> None:
    """Concurrency over KV tokens stays the full grid's (sessions are whole, so the mean context
    is the same trace's), and the closed loop turns over the full grid's waves up to the cap."""
    for f, p in zip(fast_grid(), GRID, strict=True):
        full_kv = p.replicas * p.profile.default_num_gpu_blocks * p.profile.block_size
        assert f.num_gpu_blocks is not None
        fast_kv = f.replicas * f.num_gpu_blocks * f.profile.block_size
        assert f.concurrency / fast_kv == pytest.approx(p.concurrency / full_kv, rel=0.03), f.key
        assert f.concurrency == pytest.approx(p.concurrency * FAST_SCALE, abs=1)
        assert f.sessions / f.concurrency == pytest.approx(min(p.sessions / p.concurrency, FAST_MAX_WAVES),
                                                           rel=0.03), f.key


def test_the_fast_grids_sessions_are_the_full_grids_first_sessions_whole_and_fit() -> None:
    traces: dict[tuple[str, int], list[TraceSession]] = {}
    for f, p in zip(fast_grid(), GRID, strict=True):
        full = traces.setdefault((p.kind, p.sessions),
                                 list(generate(GenerateOptions(kind=p.kind, sessions=p.sessions, seed=0))))
        fast = list(generate(GenerateOptions(kind=f.kind, sessions=f.sessions, seed=0)))
        assert fast == full[: f.sessions], f.key
        assert f.num_gpu_blocks is not None
        capacity = min(f.num_gpu_blocks * f.profile.block_size, f.profile.max_model_len)
        for s in fast:
            last = len(s.turns) - 1
            assert s.prompt_tokens(last) + s.turns[last].output_tokens < capacity, (f.key, s.session_id)


def _doc(key: str, values: dict[str, tuple[float, float, float, float]]) -> dict[str, object]:
    names = ("mean_task_latency_s", "mean_ttft_s", "decode_tok_s_makespan", "decode_tok_s_busy")
    return {"key": key, "policies": {p: dict(zip(names, v, strict=True)) for p, v in values.items()}}


def test_agreement_of_two_grids(tmp_path: Path) -> None:
    full = {"configurations": [_doc("a/x/c1", {"tao": (1, 1, 9, 9), "rr": (3, 3, 7, 7), "ta": (2, 2, 8, 8)}),
                               _doc("b/y/c2", {"tao": (1, 1, 9, 9), "rr": (3, 3, 7, 7)})]}
    fast = {"configurations": [_doc("a/x/c1/fast", {"tao": (1, 1, 9, 7), "rr": (3, 3, 7, 9), "ta": (2, 2, 8, 8)}),
                               _doc("b/y/c2/fast", {"tao": (2, 2, 9, 9), "rr": (1, 3, 7, 7)})]}
    (tmp_path / "full.json").write_text(json.dumps(full))
    (tmp_path / "fast.json").write_text(json.dumps(fast))
    res = grid_agreement({c["key"]: c["policies"] for c in full["configurations"]},  # type: ignore[index]
                         {c["key"].removesuffix("/fast"): c["policies"] for c in fast["configurations"]})  # type: ignore[index]
    a = res["per_configuration"]["a/x/c1"]
    assert a["mean_task_latency_s"]["kendall_tau"] == 1.0
    assert a["decode_tok_s_busy"]["kendall_tau"] == -1.0 and not a["decode_tok_s_busy"]["same_winner"]
    assert res["per_configuration"]["b/y/c2"]["mean_task_latency_s"]["same_winner"] is False
    assert res["overall"]["mean_task_latency_s"]["winner_agrees_share"] == 0.5
    assert res["overall"]["mean_ttft_s"]["mean_kendall_tau"] == 1.0
    out = tmp_path / "agree.json"
    assert bench_main(["--agreement", str(tmp_path / "full.json"), str(tmp_path / "fast.json"),
                       "--json", str(out)]) == 0
    assert json.loads(out.read_text())["overall"]["mean_task_latency_s"]["configurations"] == 2
