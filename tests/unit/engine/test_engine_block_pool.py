"""Block pool / prefix cache invariants (vLLM V1 semantics)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.sim.engine import kv_cache
from services.sim.engine.kv_cache import BlockPool, KVRequest
from services.sim.engine.tokens import (
    BLOCK_SIZE,
    ROOT_HASH,
    ChainCache,
    SyntheticContent,
    TokenListContent,
    chain_hash,
    synthetic_token_id,
)


def _req(tokens: list[int]) -> KVRequest:
    return KVRequest(TokenListContent(tokens), len(tokens))


def _prefill(pool: BlockPool, req: KVRequest) -> list[int]:
    hit = pool.computed_blocks(req)
    assert pool.allocate_slots(req, req.num_tokens - len(hit) * BLOCK_SIZE, len(hit))
    req.num_computed_tokens = req.num_tokens
    return hit


def test_block_hash_chains_parent_and_tokens() -> None:
    toks = list(range(48))
    h = TokenListContent(toks).block_hashes(3)
    assert h[0] == chain_hash(ROOT_HASH, tuple(toks[0:16]))
    assert h[1] == chain_hash(h[0], tuple(toks[16:32]))
    assert h[2] == chain_hash(h[1], tuple(toks[32:48]))
    # Same block tokens behind a different prefix hash differently.
    other = TokenListContent([999] + toks[1:]).block_hashes(3)
    assert other[1] != h[1] and other[2] != h[2]
    # Partial blocks are never hashed.
    assert len(TokenListContent(toks[:47]).block_hashes(3)) == 2


def test_only_full_blocks_cached_and_lookup_stops_at_first_miss() -> None:
    pool = BlockPool(32)
    a = _req(list(range(40)))  # 2 full blocks + 8 tokens
    _prefill(pool, a)
    assert [pool.block_hash[b] is not None for b in a.blocks] == [True, True, False]
    # b shares block 0, differs in block 1, equal again in block 2: only block 0 hits.
    toks = list(range(64))
    toks[20] = 7777
    b = _req(toks)
    assert pool.computed_blocks(b) == [a.blocks[0]]


@pytest.mark.parametrize(("prompt_len", "max_hit"), [(16, 0), (17, 16), (32, 16), (33, 32), (48, 32), (49, 48)])
def test_last_prompt_token_is_always_recomputed(prompt_len: int, max_hit: int) -> None:
    pool = BlockPool(64)
    toks = list(range(64))
    warm = _req(toks)
    _prefill(pool, warm)
    pool.free(warm)
    req = _req(toks[:prompt_len])
    assert len(pool.computed_blocks(req)) * BLOCK_SIZE == max_hit == (prompt_len - 1) // 16 * 16


def test_free_appends_tail_first_and_lru_pops_head() -> None:
    pool = BlockPool(9)  # null block 0 + 8 usable
    a = _req(list(range(48)))
    _prefill(pool, a)
    assert a.blocks == [1, 2, 3]
    pool.free(a)
    assert list(pool.free_queue) == [4, 5, 6, 7, 8, 3, 2, 1]
    # Freed blocks keep their hashes until popped.
    assert all(pool.block_hash[b] is not None for b in (1, 2, 3))
    b = _req(list(range(1000, 1096)))  # 6 blocks: pops 4..8 then 3 (evicts a's last block)
    _prefill(pool, b)
    assert b.blocks == [4, 5, 6, 7, 8, 3]
    assert pool.num_evictions == 1
    # a's prefix is still cached up to the evicted block: the walk stops at block 2.
    again = _req(list(range(48)) + [5])
    assert pool.computed_blocks(again) == [1, 2]


def test_hit_takes_block_off_free_queue_and_refcounts() -> None:
    pool = BlockPool(9)
    a = _req(list(range(33)))
    _prefill(pool, a)
    pool.free(a)
    free_before = pool.num_free_blocks
    b = _req(list(range(33)))
    hit = _prefill(pool, b)
    assert hit == [1, 2]
    assert 1 not in pool.free_queue and 2 not in pool.free_queue
    assert pool.ref_cnt[1] == pool.ref_cnt[2] == 1
    # 3 blocks in use, 2 of them came off the free queue by the hit, 1 popped fresh.
    assert pool.num_free_blocks == free_before - 3
    c = _req(list(range(33)))
    _prefill(pool, c)
    assert pool.ref_cnt[1] == pool.ref_cnt[2] == 2
    pool.free(b)
    assert pool.ref_cnt[1] == 1 and 1 not in pool.free_queue
    pool.free(c)
    assert 1 in pool.free_queue and 2 in pool.free_queue


def test_hit_blocks_on_free_queue_count_against_allocation() -> None:
    pool = BlockPool(5)  # 4 usable
    a = _req(list(range(48)))
    _prefill(pool, a)
    pool.free(a)  # queue: 4 3 2 1 (all cached except 4? 4 never used)
    b = _req(list(range(48)) + list(range(500, 532)))  # 80 tokens = 5 blocks > 4 usable
    hit = pool.computed_blocks(b)
    assert len(hit) == 3
    assert not pool.allocate_slots(b, 80 - 48, len(hit))
    # Failure changes nothing.
    assert pool.num_free_blocks == 4 and all(pool.ref_cnt[x] == 0 for x in hit)


def test_usage_formula_excludes_null_block() -> None:
    pool = BlockPool(11)
    assert pool.usage == 0.0
    a = _req(list(range(16 * 5)))
    _prefill(pool, a)
    assert pool.usage == pytest.approx(1 - 5 / 10)
    pool.free(a)
    assert pool.usage == 0.0
    no_null = BlockPool(10, reserve_null_block=False)
    b = _req(list(range(16 * 5)))
    _prefill(no_null, b)
    assert no_null.usage == pytest.approx(0.5)


def test_duplicate_blocks_are_tracked_and_evicted_cleanly() -> None:
    pool = BlockPool(16)
    toks = list(range(32))
    a, b = _req(toks), _req(toks)
    # Both scheduled before either is cached: b cannot hit (same step), so it computes duplicates.
    assert pool.allocate_slots(a, 32)
    assert pool.allocate_slots(b, 32)
    # Two hashes, each cached in two blocks (vLLM's "duplicated blocks").
    assert pool.num_cached_blocks == 4
    assert a.blocks != b.blocks
    pool.free(a)
    pool.free(b)
    # Evict everything by allocating all blocks; the hash map must end empty.
    c = _req(list(range(5000, 5000 + 15 * 16)))
    assert pool.allocate_slots(c, 15 * 16)
    assert all(not pool.is_cached(h) for h in TokenListContent(toks).block_hashes(2))


def test_synthetic_content_matches_contract_b() -> None:
    s = SyntheticContent("sess", "sys", 40)
    ids = s.token_ids(0, 60)
    assert ids[:40] == [synthetic_token_id("sys", i) for i in range(40)]
    assert ids[40:] == [synthetic_token_id("sess", i) for i in range(40, 60)]
    # Two sessions share exactly the blocks fully inside the shared prefix.
    t = SyntheticContent("other", "sys", 40)
    hs, ht = s.block_hashes(4), t.block_hashes(4)
    assert hs[:2] == ht[:2] and hs[2] != ht[2]
    # Without a shared prefix id the system length is ignored.
    assert SyntheticContent("x", None, 40).block_hashes(3) == SyntheticContent("x").block_hashes(3)


def test_chain_cache_shares_one_growing_chain_per_session() -> None:
    cache = ChainCache(max_chains=2)
    a = cache.synthetic("s1", "p", 32)
    a.block_hashes(10)
    b = cache.synthetic("s1", "p", 32)
    assert b.block_hashes(5)[:5] == a.block_hashes(5)[:5]
    assert b.block_hashes(0) is a.block_hashes(0)  # same list object
    cache.synthetic("s2")
    cache.synthetic("s3")  # evicts s1's chain
    c = cache.synthetic("s1", "p", 32)
    assert c.block_hashes(0) is not a.block_hashes(0)
    assert c.block_hashes(10) == a.block_hashes(10)[:10]
    assert len(cache) == 2  # s3 and s1 (s2 evicted when s1 came back)
    cache.forget("s1")
    assert len(cache) == 1


def test_chain_cache_is_bounded_by_hashes_held() -> None:
    """Ever-new sessions (a soak) cannot grow the cache past ``max_hashes`` (+ the growth of
    the chain handed out last): the oldest chains go first, values stay identical."""
    cache = ChainCache(max_chains=10_000, max_hashes=1_000)
    first = cache.synthetic("s0")
    first.block_hashes(300)
    for i in range(1, 50):
        cache.synthetic(f"s{i}").block_hashes(300)
        assert cache.stored_hashes <= 1_000
    assert len(cache) <= 4
    again = cache.synthetic("s0")
    assert again.block_hashes(0) is not first.block_hashes(0)  # dropped and rebuilt
    assert again.block_hashes(300) == first.block_hashes(300)
    cache.forget("s0")
    assert cache.stored_hashes <= 1_000 and all(k[0] != "s0" for k in cache._chains)


def test_content_memos_are_bounded() -> None:
    pool = BlockPool(64)
    chains = ChainCache()
    for i in range(kv_cache.MAX_CONTENT_MEMOS + 10):
        pool.content_hit_count(chains.synthetic(f"m{i}"), 4)
    assert len(pool._content_memos) <= kv_cache.MAX_CONTENT_MEMOS
    assert ("m0", None, 0) not in pool._content_memos  # the oldest went first
    assert (f"m{kv_cache.MAX_CONTENT_MEMOS + 9}", None, 0) in pool._content_memos


@settings(max_examples=60, deadline=None)
@given(ops=st.lists(st.tuples(st.integers(0, 5), st.integers(1, 12), st.booleans()), min_size=5, max_size=60))
def test_memoised_hit_count_equals_fresh_walk(ops: list[tuple[int, int, bool]]) -> None:
    """The eviction-log memo never changes a lookup result (checked against a memo-less walk)."""
    pool = BlockPool(24)
    chains = ChainCache()
    waiting = {s: KVRequest(chains.synthetic(f"s{s % 3}", "sys" if s % 2 else None, 40), 16 * 12 + 1)
               for s in range(6)}
    live: list[KVRequest] = []
    for session, blocks, release in ops:
        probe = waiting[session]
        hashes = probe.content.block_hashes(12)
        assert pool.get_computed_blocks(probe) == pool.hit_count(hashes, 12)
        key_probe = chains.synthetic(f"s{session % 3}", "sys" if session % 2 else None, 40)
        assert pool.content_hit_count(key_probe, 12) == pool.hit_count(hashes, 12)
        req = KVRequest(chains.synthetic(f"s{session % 3}", "sys" if session % 2 else None, 40), blocks * 16)
        hit = min(pool.get_computed_blocks(req), blocks - 1)
        if pool.allocate_slots(req, blocks * 16 - hit * 16, hit):
            req.num_computed_tokens = blocks * 16
            live.append(req)
        if release and live:
            pool.free(live.pop(0))
