"""vLLM ``docs/design/prefix_caching.md`` "Example", reproduced step by step.

Block size 4, 10 blocks (the doc's pool has no null block), block ids as in the doc's figures.
Time 1: request 0 (15 prompt tokens) gets blocks 0-3; 0, 1, 2 are full and cached.
Time 2-3: decoding fills block 3 (cached) and asks for block 4.
Time 4: request 1 (14 tokens, first 10 shared) hits blocks 0, 1 only (block 2 matches 2 of 4).
Time 5: request 0 finishes: 4, 3, 2 join the free queue in reverse order (0, 1 still used).
Time 6: request 1 finishes: queue is 7 8 9 4 3 2 6 5 1 0.
Time 7: request 2 (29 tokens, first 12 shared with request 0) hits 0, 1, 2, which leave the
queue (7 8 9 4 3 6 5); it is allocated 0 1 2 7 8 9 4 3, and block 3 is evicted.
"""

from __future__ import annotations

from services.sim.engine.kv_cache import BlockPool, KVRequest
from services.sim.engine.tokens import TokenListContent

BS = 4


def _req(tokens: list[int], prompt_len: int) -> KVRequest:
    return KVRequest(TokenListContent(tokens, block_size=BS), prompt_len)


def _schedule(pool: BlockPool, req: KVRequest, *, new: bool) -> list[int]:
    """One scheduling of ``req`` for all its uncomputed tokens; returns the hit blocks."""
    hit = pool.computed_blocks(req) if new else []
    if new:
        req.num_computed_tokens = 0
    n = req.num_tokens - req.num_computed_tokens - len(hit) * BS
    assert pool.allocate_slots(req, n, len(hit))
    req.num_computed_tokens += len(hit) * BS + n
    req.num_tokens += 1  # the step samples one token
    return hit


def _free_order(pool: BlockPool) -> list[int]:
    return list(pool.free_queue)


def test_prefix_caching_worked_example() -> None:
    pool = BlockPool(10, BS, reserve_null_block=False)
    r0_tokens = list(range(100, 117))  # 15 prompt tokens + 2 generated
    r0 = _req(r0_tokens, 15)

    # Time 1
    assert _schedule(pool, r0, new=True) == []
    assert r0.blocks == [0, 1, 2, 3]
    assert [pool.block_hash[b] is not None for b in range(4)] == [True, True, True, False]
    assert _free_order(pool) == [4, 5, 6, 7, 8, 9]

    # Time 2: first decode computes token 15, block 3 becomes full and is cached.
    _schedule(pool, r0, new=False)
    assert r0.blocks == [0, 1, 2, 3]
    assert pool.block_hash[3] is not None
    # Time 3: the next decode needs a new block: block 4.
    _schedule(pool, r0, new=False)
    assert r0.blocks == [0, 1, 2, 3, 4]
    assert pool.block_hash[4] is None
    assert _free_order(pool) == [5, 6, 7, 8, 9]

    # Time 4: 14 tokens, first 10 shared with request 0.
    r1 = _req(r0_tokens[:10] + [200, 201, 202, 203], 14)
    hit = _schedule(pool, r1, new=True)
    assert hit == [0, 1]
    assert r1.blocks == [0, 1, 5, 6]
    assert pool.ref_cnt[0] == pool.ref_cnt[1] == 2
    assert pool.block_hash[5] is not None and pool.block_hash[6] is None
    assert _free_order(pool) == [7, 8, 9]

    # Time 5: request 0 finishes.
    pool.free(r0)
    assert _free_order(pool) == [7, 8, 9, 4, 3, 2]
    assert pool.block_hash[2] is not None and pool.block_hash[3] is not None

    # Time 6: request 1 finishes.
    pool.free(r1)
    assert _free_order(pool) == [7, 8, 9, 4, 3, 2, 6, 5, 1, 0]
    assert pool.usage == 0.0

    # Time 7: 29 tokens, first 12 shared with request 0.
    r2 = _req(r0_tokens[:12] + list(range(300, 317)), 29)
    evicted_hash = pool.block_hash[3]
    assert evicted_hash is not None and pool.is_cached(evicted_hash)
    hit = pool.computed_blocks(r2)
    assert hit == [0, 1, 2]
    assert pool.allocate_slots(r2, 29 - 12, len(hit))
    assert r2.blocks == [0, 1, 2, 7, 8, 9, 4, 3]
    assert _free_order(pool) == [6, 5]
    assert pool.num_evictions == 1
    assert not pool.is_cached(evicted_hash)
    # Block 3 was reused for request 2's 8th block; it is partial (29 tokens) so holds no hash.
    assert pool.block_hash[3] is None
