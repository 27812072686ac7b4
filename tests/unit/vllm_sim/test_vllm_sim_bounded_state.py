"""`tao vllm-sim` keeps bounded state however many sessions pass through it (a soak of
ever-new sessions grew a replica by ~185 MB per 10 minutes, docs/benchmarks.md#soak).

The replica's core (request planning, the runner's streams, the engine and its KV pool, the
hash-chain and render caches) is driven here without HTTP or a clock: ever-new synthetic
sessions, each turn a longer prompt of the same session, and the sizes of every per-session or
per-request container are checked against their bounds."""

from __future__ import annotations

import pytest

from services.sim.engine import kv_cache
from services.sim.engine.tokens import BLOCK_SIZE, SyntheticContent
from services.sim.vllm_sim.protocol import parse_chat
from services.sim.vllm_sim.server import (
    CHAIN_HASHES_MIN,
    CHAIN_HASHES_PER_GPU_BLOCK,
    RenderCache,
    build_server,
)

NUM_GPU_BLOCKS = 512
PROMPT_TOKENS = 3_960  # ~248 blocks: two sessions fill the pool, every request evicts
SESSIONS = 560
TURNS = 2
BATCH = 2
LOG_LIMIT = 8_192  # the eviction log's restart point, lowered so that the test crosses it many times


def _body(session: str, turn: int) -> dict[str, object]:
    return {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2, "ignore_eos": True,
            "tao_synthetic": {"session_id": session, "prompt_tokens": PROMPT_TOKENS - 40 * (TURNS - 1 - turn)}}


async def test_per_session_and_per_request_state_stays_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kv_cache, "_LOG_LIMIT", LOG_LIMIT)
    srv = build_server("qwen3-32b-h100x2", model_name="m", num_gpu_blocks=NUM_GPU_BLOCKS, max_model_len=4_096)
    engine, runner, pool = srv.engine, srv.runner, srv.engine.pool
    max_hashes = max(CHAIN_HASHES_MIN, CHAIN_HASHES_PER_GPU_BLOCK * NUM_GPU_BLOCKS)
    peak_chains = peak_hashes = peak_log = finished = 0
    streams = []
    for first in range(0, SESSIONS, BATCH):
        for turn in range(TURNS):
            for s in range(first, first + BATCH):
                req, pieces = srv._plan(parse_chat(_body(f"session-{s}", turn), srv.model_name))
                streams.append(runner.submit(req, pieces))
            now = 0.0
            while engine.has_work():
                result = engine.step()
                now += result.duration_s
                runner._publish(result, now)
                finished += len(result.finished)
            peak_chains = max(peak_chains, len(srv.chains))
            peak_hashes = max(peak_hashes, srv.chains.stored_hashes)
            peak_log = max(peak_log, len(pool._evict_log))
    assert finished == SESSIONS * TURNS and all(s.finished is not None for s in streams)
    # hashes generated far beyond the chain cache's bound, evictions beyond the log's
    assert SESSIONS * PROMPT_TOKENS // BLOCK_SIZE > 2 * max_hashes
    assert pool.num_evictions > 10 * LOG_LIMIT
    # the runner and the engine forget finished requests
    assert runner.num_streams == 0 and engine._by_id == {} and not engine._waiting and not engine._running
    # caches stay within their bounds (a chain's hashes are counted when it is handed out:
    # it may grow by one request's prompt beyond that in its holder's hands)
    chain_blocks = (PROMPT_TOKENS - 40) // BLOCK_SIZE  # the shortest chain a session leaves
    assert peak_hashes <= max_hashes + PROMPT_TOKENS // BLOCK_SIZE
    assert peak_chains <= max_hashes // chain_blocks + 2 < SESSIONS // 2
    assert peak_log <= LOG_LIMIT
    assert len(pool._content_memos) <= kv_cache.MAX_CONTENT_MEMOS
    assert pool.num_cached_blocks <= NUM_GPU_BLOCKS


def test_render_cache_is_bounded_by_tokens_and_chains() -> None:
    cache = RenderCache(max_chains=50, max_tokens=2_000)
    for i in range(400):
        content = SyntheticContent(f"s{i}")
        for n in (300, 600):  # the session's next turn grows its chain
            text = cache.ids_text(content, n)
            assert text == ",".join(map(str, content.token_ids(0, n)))
        assert cache.stored_tokens <= 2_000 and len(cache) <= 3
    cache = RenderCache(max_chains=50, max_tokens=10**9)
    for i in range(400):
        cache.ids_text(SyntheticContent(f"s{i}"), 8)
    assert len(cache) == 50 and cache.stored_tokens == 50 * 8
