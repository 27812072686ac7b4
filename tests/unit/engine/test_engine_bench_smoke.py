"""The engine benchmark runs at minimal sizes and reports sane figures."""

from __future__ import annotations

from bench.engine.engine_bench import decode_batch, sharegpt, swe_like


def test_engine_bench_smoke() -> None:
    d = decode_batch(4, 30)
    assert d.steps == 30 and d.sim_s > 0 and d.steps_per_s > 0
    s = sharegpt(20)
    assert s.steps > 0 and s.preemptions == 0
    w = swe_like(2, 2)
    assert w.steps > 0 and 0.0 < w.hit_rate < 1.0  # turn 2 of each session hits turn 1
