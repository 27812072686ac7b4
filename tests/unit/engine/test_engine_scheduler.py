"""Scheduler behaviour of the engine model (vLLM V1 FCFS with chunked prefill)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.sim.engine import Engine, EngineRequest, StepResult, get_profile
from services.sim.engine.tokens import ChainCache, SyntheticContent

PROFILE = get_profile("qwen3-32b-h100x1")


def _engine(**kw: Any) -> Engine:
    return Engine(PROFILE, **kw)


def _req(rid: str, prompt: int, out: int, content: SyntheticContent | None = None, **kw: str) -> EngineRequest:
    return EngineRequest(rid, content or SyntheticContent(rid), prompt, out, **kw)


def _run(e: Engine) -> list[StepResult]:
    steps = []
    while e.has_work():
        steps.append(e.step())
        assert len(steps) < 100_000
    return steps


def test_token_budget_running_first_then_waiting_fcfs() -> None:
    e = _engine(max_num_batched_tokens=150)
    for i in range(3):
        e.add_request(_req(f"r{i}", 100, 5))
    s1 = e.step()
    assert s1.num_tokens == 150 and s1.num_seqs == 2
    assert s1.first_token == ("r0",) and dict(s1.new_tokens) == {"r0": 1}
    assert e.running_ids() == ["r0", "r1"] and e.waiting_ids() == ["r2"]
    s2 = e.step()  # r0 decode 1, r1 remaining 50, r2 chunk of 99
    assert s2.num_tokens == 150 and s2.num_seqs == 3
    assert set(s2.first_token) == {"r1"} and s2.new_tokens == {"r0": 1, "r1": 1}
    s3 = e.step()  # r0, r1 decode; r2 last token
    assert s3.num_tokens == 3 and s3.first_token == ("r2",)


def test_max_num_seqs_caps_running() -> None:
    e = _engine(max_num_seqs=2)
    for i in range(4):
        e.add_request(_req(f"r{i}", 20, 3))
    e.step()
    assert e.num_running == 2 and e.num_waiting == 2
    e.step()
    e.step()  # r0, r1 produce their 3rd token and finish
    assert e.num_running == 0
    e.step()
    assert e.running_ids() == ["r2", "r3"]


def test_chunked_prefill_allocates_blocks_per_chunk() -> None:
    e = _engine(max_num_batched_tokens=256)
    e.add_request(_req("big", 1000, 2))
    counts = []
    for _ in range(4):
        s = e.step()
        counts.append(s.num_tokens)
        assert s.first_token == (() if sum(counts) < 1000 else ("big",))
        assert e.free_blocks == e.num_gpu_blocks - 1 - -(-sum(counts) // 16)
    assert counts == [256, 256, 256, 232]


def test_preemption_newest_first_by_recompute_keeps_hashes() -> None:
    # 12 usable blocks = 192 tokens. Two requests of 80 prompt tokens decode until they collide.
    e = _engine(num_gpu_blocks=13, max_model_len=190)
    e.add_request(_req("old", 80, 60))
    e.add_request(_req("new", 80, 60))
    preempted_at = None
    steps = 0
    while e.has_work():
        s = e.step()
        steps += 1
        if s.preempted and preempted_at is None:
            preempted_at = steps
            assert s.preempted == ("new",)
            assert e.waiting_ids() == ["new"] and e.running_ids() == ["old"]
            # nothing was admitted from the waiting queue in the preempting step
            assert "new" not in s.new_tokens
    assert preempted_at is not None
    assert e.num_preemptions_total >= 1
    # The preempted request resumed through the prefix cache (its hashes were kept).
    assert e.preempted_prefix_cache_queries > 0 and e.preempted_prefix_cache_hits > 0
    assert e.kv_cache_usage == 0.0


def test_preempted_request_returns_to_front_of_queue() -> None:
    e = _engine(num_gpu_blocks=13, max_model_len=190)
    e.add_request(_req("a", 80, 60))
    e.add_request(_req("b", 80, 60))
    e.add_request(_req("c", 80, 60))
    fin: list[str] = []
    while e.has_work():
        s = e.step()
        if s.preempted:
            assert e.waiting_ids()[0] == s.preempted[-1]
        fin += [f.request_id for f in s.finished]
    assert fin[0] == "a"
    assert sorted(fin) == ["a", "b", "c"]


def test_multi_turn_synthetic_session_hits_previous_turn() -> None:
    chains = ChainCache()
    e = _engine()
    e.add_request(_req("t1", 1000, 100, chains.synthetic("s", "sys", 300)))
    [fin1] = [f for s in _run(e) for f in s.finished]
    assert fin1.cached_tokens == 0 and fin1.output_tokens == 100
    # Turn 2 = turn 1 prompt + 100 outputs + 50 new tokens. Turn 1 computed 1099 tokens
    # (its last output is sampled, never computed): 68 full blocks hit.
    content = chains.synthetic("s", "sys", 300)
    assert e.cached_prefix_tokens(content, 1150) == 68 * 16
    e.add_request(_req("t2", 1150, 10, content))
    [fin2] = [f for s in _run(e) for f in s.finished]
    assert fin2.cached_tokens == 1088
    # Another session behind the same 300-token system prompt hits its 18 full blocks.
    e.add_request(_req("o1", 400, 1, chains.synthetic("other", "sys", 300)))
    [fin3] = [f for s in _run(e) for f in s.finished]
    assert fin3.cached_tokens == 288
    assert e.prefix_cache_queries == 1000 + 1150 + 400
    assert e.prefix_cache_hits == 1088 + 288


def test_abort_frees_blocks_and_reports() -> None:
    e = _engine()
    e.add_request(_req("x", 500, 50))
    e.add_request(_req("y", 10, 5))
    e.step()
    assert e.kv_cache_usage > 0
    f = e.abort("x")
    assert f is not None and f.finish_reason == "abort" and f.output_tokens == 1
    assert e.abort("x") is None
    assert e.abort("y") is not None
    assert not e.has_work() and e.kv_cache_usage == 0.0


def test_max_model_len_cuts_output_with_length() -> None:
    e = _engine(max_model_len=100)
    e.add_request(_req("long", 90, 50, finish_reason_at_max="stop"))
    e.add_request(_req("short", 10, 5, finish_reason_at_max="stop"))
    fins = {f.request_id: f for s in _run(e) for f in s.finished}
    assert fins["long"].output_tokens == 10 and fins["long"].finish_reason == "length"
    assert fins["short"].output_tokens == 5 and fins["short"].finish_reason == "stop"
    with pytest.raises(ValueError):
        e.add_request(_req("too-long", 100, 1))


def test_max_model_len_must_fit_kv_cache() -> None:
    with pytest.raises(ValueError, match="largest that fits"):
        _engine(num_gpu_blocks=10, max_model_len=1000)
    assert _engine(num_gpu_blocks=10).max_model_len == 9 * 16


@settings(max_examples=40, deadline=None)
@given(
    reqs=st.lists(
        st.tuples(st.integers(1, 300), st.integers(1, 40), st.integers(0, 3), st.integers(0, 2)),
        min_size=1, max_size=25,
    ),
    blocks=st.integers(30, 80),
    budget=st.integers(16, 300),
    max_seqs=st.integers(1, 8),
)
def test_random_workloads_keep_block_accounting(
    reqs: list[tuple[int, int, int, int]], blocks: int, budget: int, max_seqs: int
) -> None:
    e = _engine(num_gpu_blocks=blocks, max_num_batched_tokens=budget, max_num_seqs=max_seqs)
    chains = ChainCache()
    want: dict[str, int] = {}
    for i, (prompt, out, sess, shared) in enumerate(reqs):
        prompt = min(prompt, e.max_model_len - 1)
        content = chains.synthetic(f"s{sess}", f"p{shared}" if shared else None, 40)
        e.add_request(EngineRequest(f"r{i}", content, prompt, out))
        want[f"r{i}"] = min(out, e.max_model_len - prompt)
    got: dict[str, int] = {}
    pool = e.pool
    while e.has_work():
        s = e.step()
        assert s.num_tokens <= budget
        assert e.num_running <= max_seqs
        for f in s.finished:
            got[f.request_id] = f.output_tokens
        in_use = sum(1 for b in range(1, blocks) if pool.ref_cnt[b] > 0)
        assert in_use + pool.num_free_blocks == blocks - 1
        assert all(pool.ref_cnt[b] == 0 for b in pool.free_queue)
        assert len(got) <= len(reqs)
    assert got == want
    assert e.kv_cache_usage == 0.0
