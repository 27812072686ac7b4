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

Performance: vLLM re-walks a waiting request's prefix every step it stays blocked; for 60k-token
contexts that walk dominates a simulation. ``HitMemo`` makes repeated walks incremental and
still exact: a hash's chain depth is fixed by the hash itself, so every eviction is logged as
``(depth, hash)``; a memoised count ``n`` shrinks to ``d`` when a logged ``(d, h)`` has
``d < n and hashes[d] == h``, then the walk resumes from ``n`` against the live cache (which
also picks up blocks cached since).

KV events (off unless ``enable_kv_events``): like vLLM's ``BlockPool`` (``cache_full_blocks``,
``_maybe_evict_cached_block``, ``reset_prefix_cache``), the pool records a ``BlockStored`` for
each run of newly hashed blocks of a request (its parent hash, the blocks' token ids), a
``BlockRemoved`` for the hashes evicted by one allocation (one entry per physical block) and
``AllBlocksCleared`` on a prefix-cache reset; ``take_events`` hands them out, once. The schema is
``services.common.kv_events``.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Hashable, Sequence

from services.common.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent
from services.sim.engine.tokens import BLOCK_SIZE, TokenContent

MAX_CONTENT_MEMOS = 8192  # lookup memos kept for content seen across requests (an optimisation only)
# Eviction-log entries kept before the log restarts (memos then re-walk once). An entry is a
# (depth, hash) tuple, ~100 bytes: 1 << 20 of them held ~100 MB in a long-running replica.
_LOG_LIMIT = 1 << 18


class HitMemo:
    """How many leading hashes of one chain were cached at a point of the eviction log."""

    __slots__ = ("blocks", "epoch", "log_pos", "n")

    def __init__(self) -> None:
        self.n = 0
        self.epoch = -1
        self.log_pos = 0
        self.blocks: list[int] = []  # block ids of the first len(blocks) <= n hashes


class KVRequest:
    """The block-table side of a request (the engine's request state extends it)."""

    __slots__ = ("blocks", "content", "hit_memo", "num_cached_blocks", "num_computed_tokens", "num_tokens")

    def __init__(self, content: TokenContent, num_tokens: int) -> None:
        self.content = content
        self.num_tokens = num_tokens  # prompt + outputs sampled so far
        self.num_computed_tokens = 0
        self.blocks: list[int] = []
        self.num_cached_blocks = 0  # leading blocks of ``blocks`` already hashed into the cache
        self.hit_memo = HitMemo()


class BlockPool:
    """Block pool + free queue + hash->block map + per-request slot allocation."""

    def __init__(
        self, num_blocks: int, block_size: int = BLOCK_SIZE, *, reserve_null_block: bool = True
    ) -> None:
        # Contents must hash with the same block size (SyntheticContent uses BLOCK_SIZE).
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        first = 1 if reserve_null_block else 0
        if num_blocks <= first:
            raise ValueError(f"num_blocks must be > {first}, got {num_blocks}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.reserve_null_block = reserve_null_block
        self._usable = num_blocks - first
        self.ref_cnt: list[int] = [0] * num_blocks
        self.block_hash: list[int | None] = [None] * num_blocks
        self._depth: list[int] = [0] * num_blocks  # chain index of a cached block
        # Ordered dict as an O(1) doubly linked LRU list: head = least recently used.
        self.free_queue: OrderedDict[int, None] = OrderedDict((b, None) for b in range(first, num_blocks))
        self._cached: dict[int, int] = {}
        # Rare: the same hash cached in several blocks (vLLM "duplicated blocks").
        self._dups: dict[int, list[int]] = {}
        self.num_evictions = 0
        self._evict_log: list[tuple[int, int]] = []
        self._epoch = 0
        self._content_memos: dict[Hashable, HitMemo] = {}
        self._events: list[KVEvent] | None = None  # None: KV events off

    # -------------------------------------------------------------- KV events
    def enable_kv_events(self) -> None:
        """Start recording KV events (the blocks cached so far are not announced)."""
        if self._events is None:
            self._events = []

    @property
    def kv_events_enabled(self) -> bool:
        return self._events is not None

    def take_events(self) -> list[KVEvent]:
        """The events recorded since the last call, oldest first."""
        events = self._events
        if not events:
            return []
        self._events = []
        return events

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash, as vLLM's ``reset_prefix_cache``: only when no block is in
        use (returns False, changing nothing, otherwise)."""
        if any(self.ref_cnt):
            return False
        self.block_hash = [None] * self.num_blocks
        self._cached.clear()
        self._dups.clear()
        self._evict_log.clear()
        self._epoch += 1
        if self._events is not None:
            self._events.append(AllBlocksCleared())
        return True

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

    def cached_hash_counts(self) -> dict[int, int]:
        """Every cached hash with the number of physical blocks holding it (ground truth for
        KV-event subscribers)."""
        counts = dict.fromkeys(self._cached, 1)
        for h, extra in self._dups.items():
            counts[h] += len(extra)
        return counts

    def is_cached(self, block_hash: int) -> bool:
        return block_hash in self._cached

    def hit_count(self, hashes: Sequence[int], max_blocks: int, memo: HitMemo | None = None) -> int:
        """Number of leading ``hashes`` (at most ``max_blocks``) that are cached now."""
        cached = self._cached
        limit = min(max_blocks, len(hashes))
        if memo is None:
            memo = HitMemo()
        if memo.epoch != self._epoch:
            n = 0
        else:
            n = memo.n
            log = self._evict_log
            if memo.log_pos < len(log):
                for i in range(memo.log_pos, len(log)):
                    d, h = log[i]
                    if d < n and hashes[d] == h:
                        n = d
        if len(memo.blocks) > n:
            del memo.blocks[n:]
        while n < limit and hashes[n] in cached:
            n += 1
        memo.n = n
        memo.epoch = self._epoch
        memo.log_pos = len(self._evict_log)
        return n if n < limit else limit

    def content_hit_count(self, content: TokenContent, max_blocks: int) -> int:
        """``hit_count`` for arbitrary content, memoised per ``content.memo_key`` if it has one."""
        key = getattr(content, "memo_key", None)
        memo = None
        if key is not None:
            memo = self._content_memos.get(key)
            if memo is None:
                memos = self._content_memos
                if len(memos) >= MAX_CONTENT_MEMOS:  # drop the oldest half (insertion order)
                    for old in list(itertools.islice(memos, MAX_CONTENT_MEMOS // 2)):
                        del memos[old]
                memo = memos[key] = HitMemo()
        return self.hit_count(content.block_hashes(max_blocks), max_blocks, memo)

    def blocks_for(self, hashes: Sequence[int], num_blocks: int, memo: HitMemo | None = None) -> list[int]:
        """Block ids holding the first ``num_blocks`` hashes (all cached, as a fresh
        ``hit_count`` with the same ``memo`` has just established)."""
        if memo is None:
            return list(map(self._cached.__getitem__, hashes[:num_blocks]))
        blocks = memo.blocks
        have = len(blocks)
        if have < num_blocks:
            blocks.extend(map(self._cached.__getitem__, hashes[have:num_blocks]))
        return blocks[:num_blocks]

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
        popitem = self.free_queue.popitem
        ref = self.ref_cnt
        bh = self.block_hash
        depth = self._depth
        cached = self._cached
        dups = self._dups
        log = self._evict_log
        if len(log) + n > _LOG_LIMIT:
            log.clear()
            self._epoch += 1
        out: list[int] = []
        evicted = 0
        removed: list[int | bytes] | None = None if self._events is None else []
        for _ in range(n):
            b = popitem(last=False)[0]
            h = bh[b]
            if h is not None:
                bh[b] = None
                evicted += 1
                log.append((depth[b], h))
                if removed is not None:
                    removed.append(h)
                if h in dups:
                    self._evict_dup(b, h)
                else:
                    del cached[h]
            ref[b] = 1
            out.append(b)
        self.num_evictions += evicted
        if removed and self._events is not None:
            self._events.append(BlockRemoved(removed))
        return out

    def _evict_dup(self, block: int, h: int) -> None:
        dups = self._dups[h]
        if self._cached[h] == block:
            self._cached[h] = dups.pop(0)
        else:
            dups.remove(block)
        if not dups:
            del self._dups[h]

    def cache_block(self, block: int, h: int, depth: int) -> None:
        if self.block_hash[block] is not None:
            return
        self.block_hash[block] = h
        self._depth[block] = depth
        if h in self._cached:
            self._dups.setdefault(h, []).append(block)
        else:
            self._cached[h] = block
        if self._events is not None:  # a lone block: its token ids are unknown here
            self._events.append(BlockStored([h], None, [], self.block_size, None))

    def free_blocks(self, blocks: Sequence[int]) -> None:
        """Release one reference to each block; blocks reaching 0 join the tail, last first."""
        ref = self.ref_cnt
        free = self.free_queue
        for b in reversed(blocks):
            ref[b] -= 1
            if ref[b] == 0:
                free[b] = None

    # ------------------------------------------------------ request-level ops
    def get_computed_blocks(self, req: KVRequest) -> int:
        """Number of cached leading blocks of a request, capped so its last token recomputes."""
        max_blocks = (req.num_tokens - 1) // self.block_size
        if max_blocks <= 0:
            return 0
        return self.hit_count(req.content.block_hashes(max_blocks), max_blocks, req.hit_memo)

    def computed_blocks(self, req: KVRequest) -> list[int]:
        """Block ids of ``get_computed_blocks`` (explicit form, for tests and tools)."""
        n = self.get_computed_blocks(req)
        return self.blocks_for(req.content.block_hashes(n), n, req.hit_memo)

    def allocate_slots(self, req: KVRequest, num_new_tokens: int, num_hit_blocks: int = 0) -> bool:
        """Give ``req`` room for ``num_new_tokens`` more tokens after ``num_hit_blocks`` hit blocks.

        ``num_hit_blocks`` must come from ``get_computed_blocks`` in the same step. Returns False,
        changing nothing, when the free queue cannot supply the blocks (hit blocks that sit in
        the free queue count against it, as in vLLM). On success, every block that is full once
        these tokens are computed is hashed into the cache.
        """
        bs = self.block_size
        num_computed = req.num_computed_tokens + num_hit_blocks * bs
        total = num_computed + num_new_tokens
        num_new_blocks = -(-total // bs) - len(req.blocks) - num_hit_blocks
        free_n = len(self.free_queue)
        hit: list[int] = []
        if num_new_blocks > free_n:
            return False
        if num_hit_blocks:
            hit = self.blocks_for(req.content.block_hashes(num_hit_blocks), num_hit_blocks, req.hit_memo)
            if num_new_blocks + num_hit_blocks > free_n:
                ref = self.ref_cnt
                evictable = list(map(ref.__getitem__, hit)).count(0)
                if num_new_blocks > free_n - evictable:
                    return False
            self.touch(hit)
            req.blocks.extend(hit)
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
        depth = self._depth
        cached = self._cached
        stored: list[int] | None = None if self._events is None else []
        for i in range(req.num_cached_blocks, num_full):
            b = blocks[i]
            if bh[b] is None:
                h = hashes[i]
                bh[b] = h
                depth[b] = i
                if h in cached:
                    self._dups.setdefault(h, []).append(b)
                else:
                    cached[h] = b
                if stored is not None:
                    stored.append(i)
        req.num_cached_blocks = num_full
        if stored:
            self._announce(req, hashes, stored)

    def _announce(self, req: KVRequest, hashes: Sequence[int], stored: list[int]) -> None:
        """One ``BlockStored`` per run of consecutive chain indices in ``stored``."""
        assert self._events is not None
        bs = self.block_size
        start = prev = stored[0]
        for i in [*stored[1:], -1]:
            if i == prev + 1:
                prev = i
                continue
            self._events.append(BlockStored(list(hashes[start:prev + 1]), hashes[start - 1] if start else None,
                                            req.content.token_ids(start * bs, (prev + 1) * bs), bs, None))
            start = prev = i

    def free(self, req: KVRequest) -> None:
        self.free_blocks(req.blocks)
        req.blocks = []
        req.num_cached_blocks = 0
