"""KV block pool and prefix cache, modelled on vLLM V1 (``vllm/v1/core/block_pool.py``,
``kv_cache_manager.py``; ``docs/design/prefix_caching.md``).

Invariants (all checked by tests/unit/engine):
- Blocks hold ``block_size`` tokens; only *full* blocks carry a hash and are cached.
- A block is in the free queue iff its ref count is 0 (the null block, id 0 when reserved, is
  never in it). Free blocks keep their hash and stay hittable until popped for a new
  allocation; popping a cached block evicts it (its hash leaves the cache).
- The free queue is LRU: allocation pops from the head; a freed request's blocks are appended
  tail-first (reverse order), so its last, longest-prefix blocks are evicted first.
- A prefix hit ("touch") takes the block off the free queue and raises its ref count.
- ``usage = 1 - num_free / (num_blocks - 1)`` when the null block is reserved (vLLM's
  ``BlockPool.get_usage``), ``1 - num_free / num_blocks`` otherwise.
- Lookup walks from block 0 and stops at the first miss; at most ``num_tokens - 1`` tokens
  may hit (the last prompt token is always recomputed to produce logits).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from sim.engine.tokens import BLOCK_SIZE, TokenContent


class KVRequest:
    """The block-table side of a request (the engine's request state extends it)."""

    __slots__ = ("blocks", "content", "num_cached_blocks", "num_computed_tokens", "num_tokens")

    def __init__(self, content: TokenContent, num_tokens: int) -> None:
        self.content = content
        self.num_tokens = num_tokens  # prompt + outputs sampled so far
        self.num_computed_tokens = 0
        self.blocks: list[int] = []
        self.num_cached_blocks = 0  # leading blocks of ``blocks`` already hashed into the cache


class BlockPool:
    """Block pool + free queue + hash->block map + per-request slot allocation."""

    def __init__(
        self, num_blocks: int, block_size: int = BLOCK_SIZE, *, reserve_null_block: bool = True
    ) -> None:
        if block_size != BLOCK_SIZE:
            raise ValueError(f"only block_size={BLOCK_SIZE} is supported (content keys are per 16 tokens)")
        first = 1 if reserve_null_block else 0
        if num_blocks <= first:
            raise ValueError(f"num_blocks must be > {first}, got {num_blocks}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.reserve_null_block = reserve_null_block
        self._usable = num_blocks - first
        self.ref_cnt: list[int] = [0] * num_blocks
        self.block_hash: list[int | None] = [None] * num_blocks
        # Ordered dict as an O(1) doubly linked LRU list: head = least recently used.
        self.free_queue: OrderedDict[int, None] = OrderedDict((b, None) for b in range(first, num_blocks))
        self._cached: dict[int, int] = {}
        # Rare: the same hash cached in several blocks (vLLM "duplicated blocks").
        self._dups: dict[int, list[int]] = {}
        self.num_evictions = 0

    # ----------------------------------------------------------------- queries
    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    @property
    def usage(self) -> float:
        return 1.0 - len(self.free_queue) / self._usable

    @property
    def num_cached_blocks(self) -> int:
        return len(self._cached) + sum(len(v) for v in self._dups.values())

    def is_cached(self, block_hash: int) -> bool:
        return block_hash in self._cached

    def longest_hit(self, hashes: Sequence[int], max_blocks: int) -> list[int]:
        """Block ids of the longest cached prefix among the first ``max_blocks`` hashes."""
        cached = self._cached
        out: list[int] = []
        for i in range(min(max_blocks, len(hashes))):
            b = cached.get(hashes[i])
            if b is None:
                break
            out.append(b)
        return out

    def count_hit_blocks(self, hashes: Sequence[int], max_blocks: int) -> int:
        cached = self._cached
        n = 0
        for i in range(min(max_blocks, len(hashes))):
            if hashes[i] not in cached:
                break
            n += 1
        return n

    # --------------------------------------------------------------- mutation
    def touch(self, blocks: Sequence[int]) -> None:
        ref = self.ref_cnt
        free = self.free_queue
        for b in blocks:
            if ref[b] == 0:
                del free[b]
            ref[b] += 1

    def pop_free(self, n: int) -> list[int]:
        """Take ``n`` blocks from the head of the free queue, evicting cached ones."""
        free = self.free_queue
        ref = self.ref_cnt
        bh = self.block_hash
        out: list[int] = []
        for _ in range(n):
            b, _unused = free.popitem(last=False)
            h = bh[b]
            if h is not None:
                self._evict(b, h)
            ref[b] = 1
            out.append(b)
        return out

    def _evict(self, block: int, h: int) -> None:
        self.block_hash[block] = None
        self.num_evictions += 1
        if self._cached.get(h) == block:
            dups = self._dups.get(h)
            if dups:
                self._cached[h] = dups.pop(0)
                if not dups:
                    del self._dups[h]
            else:
                del self._cached[h]
        else:
            dups = self._dups[h]
            dups.remove(block)
            if not dups:
                del self._dups[h]

    def cache_block(self, block: int, h: int) -> None:
        if self.block_hash[block] is not None:
            return
        self.block_hash[block] = h
        if h in self._cached:
            self._dups.setdefault(h, []).append(block)
        else:
            self._cached[h] = block

    def free_blocks(self, blocks: Sequence[int]) -> None:
        """Release one reference to each block; blocks reaching 0 join the tail, last first."""
        ref = self.ref_cnt
        free = self.free_queue
        for b in reversed(blocks):
            ref[b] -= 1
            if ref[b] == 0:
                free[b] = None

    # ------------------------------------------------------ request-level ops
    def get_computed_blocks(self, req: KVRequest) -> list[int]:
        """Cached leading blocks of a request, capped so its last token is recomputed."""
        max_blocks = (req.num_tokens - 1) // self.block_size
        if max_blocks <= 0:
            return []
        return self.longest_hit(req.content.block_hashes(max_blocks), max_blocks)

    def allocate_slots(
        self, req: KVRequest, num_new_tokens: int, new_computed_blocks: Sequence[int] = ()
    ) -> bool:
        """Give ``req`` room for ``num_new_tokens`` more tokens (after any prefix hit).

        Returns False, changing nothing, when the free queue cannot supply the blocks (hit
        blocks that sit in the free queue count against it, as in vLLM). On success, every
        block that is full once these tokens are computed is hashed into the cache.
        """
        bs = self.block_size
        num_computed = req.num_computed_tokens + len(new_computed_blocks) * bs
        total = num_computed + num_new_tokens
        num_required = -(-total // bs)
        num_new_blocks = num_required - len(req.blocks) - len(new_computed_blocks)
        if new_computed_blocks:
            ref = self.ref_cnt
            evictable = sum(1 for b in new_computed_blocks if ref[b] == 0)
        else:
            evictable = 0
        if num_new_blocks > len(self.free_queue) - evictable:
            return False
        if new_computed_blocks:
            self.touch(new_computed_blocks)
            req.blocks.extend(new_computed_blocks)
            req.num_cached_blocks = len(req.blocks)
        if num_new_blocks > 0:
            req.blocks.extend(self.pop_free(num_new_blocks))
        num_full = min(total, req.num_tokens) // bs
        if num_full > req.num_cached_blocks:
            self.cache_full_blocks(req, num_full)
        return True

    def cache_full_blocks(self, req: KVRequest, num_full: int) -> None:
        hashes = req.content.block_hashes(num_full)
        blocks = req.blocks
        bh = self.block_hash
        for i in range(req.num_cached_blocks, num_full):
            b = blocks[i]
            if bh[b] is None:
                self.cache_block(b, hashes[i])
        req.num_cached_blocks = num_full

    def free(self, req: KVRequest) -> None:
        self.free_blocks(req.blocks)
        req.blocks = []
        req.num_cached_blocks = 0
