"""``bench.kv_credit`` in small: in the cluster simulator the router's index, matched over a
session's whole context, equals the engines' true residency at every plan; with a fifth of the
KV-event batches lost and replayed it only lags until the next batch reveals a gap; the
usage-derived estimate is far off once blocks are evicted."""

from __future__ import annotations

from bench.kv_credit import measure


def test_index_is_exact_under_eviction() -> None:
    tally, sim, _ = measure("swe-lite", 12, 2, 2500, "tao", 0, 0.0, 12)
    assert tally.pairs > 100 and sum(r.engine.pool.num_evictions for r in sim.replicas) > 0
    assert tally.abs_err["index_ctx"] == 0
    assert tally.under["index"] > 0 and tally.over["index"] == 0  # the prompt alone misses the output blocks
    assert tally.abs_err["k0"] > 0 and tally.abs_err["decayed"] > 0


def test_lost_batches_only_delay_the_index() -> None:
    tally, sim, _ = measure("swe-lite", 12, 2, 2500, "tao", 0, 0.2, 12)
    assert sim.dropped > 0
    assert tally.under["index_ctx"] == 0  # a block is never missed for good
    assert tally.over["index_ctx"] <= tally.pairs // 50  # evictions in a lost last batch: seen at the next one
    assert tally.abs_err["index_ctx"] * 10 < tally.abs_err["decayed"]
