"""Which KV blocks every replica holds, from its vLLM KV-cache events (pure; no I/O, no clock).

Per replica the index folds the event batches of vLLM's ``ZmqEventPublisher`` (schema:
``services.common.kv_events``) in sequence order:

- ``BlockStored`` adds one reference per hash (a hash cached in two physical blocks is stored
  twice and removed twice, so references are counted, not set); ``BlockRemoved`` drops one;
  ``AllBlocksCleared`` empties the replica. A hash is *resident* while its count is > 0.
- Sequence numbers: a batch whose ``seq`` is the next one is applied; an older one (a replayed
  duplicate, or a live one a replay already delivered) is ignored; a newer one is a *gap*:
  nothing is applied and ``offer`` answers the first missing ``seq`` so the adapter can ask the
  replay socket for it. A live batch whose ``seq`` is not above every earlier live one means the
  publisher restarted (vLLM numbers from 0 again): the replica is emptied and must be replayed
  from 0. A gap replay cannot fill (the publisher's buffer has
  moved on) is given up with ``resync``: the replica's blocks become unknown (``synced`` False)
  until an ``AllBlocksCleared`` makes them known again, and credit falls back to the router's
  usage-derived estimate.
- The first batch of a replica must be ``seq`` 0 (else: a gap from 0), so the index starts
  from the publisher's empty cache.

Matching a session does not need the engine's hash function (vLLM's is seeded sha256 or
Python's ``hash``): every stored block also gets a *content digest* chained over its token ids
(``block_digests``), computed from the event's ``token_ids`` and its parent's digest. The
router computes the same digests over a session's prompt token ids and counts how many leading
ones a replica holds (``prefix_blocks``), which covers prefixes shared between sessions (a
common system prompt) as well as the session's own context. NVIDIA Dynamo's KV router does
the same with its "local block hashes" (github.com/ai-dynamo/dynamo,
``lib/llm/src/kv_router/indexer.rs``).
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from services.common.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch

ROOT_DIGEST = 0
"""Digest of the (empty) parent of a sequence's first block."""
REMOVED_LOG_LIMIT = 1 << 18


def _digest(parent: int, tokens: Sequence[int]) -> int:
    data = parent.to_bytes(8, "big") + array("q", tokens).tobytes()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


def block_digests(token_ids: Sequence[int], block_size: int, parent: int = ROOT_DIGEST) -> list[int]:
    """Chained content digests of the full blocks of ``token_ids`` (a partial tail is ignored)."""
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    n = len(token_ids) // block_size
    data = array("q", token_ids[:n * block_size]).tobytes()  # the bytes _digest hashes, all at once
    width = block_size * 8
    blake2b, from_bytes = hashlib.blake2b, int.from_bytes
    out: list[int] = []
    for k in range(n):
        parent = from_bytes(blake2b(parent.to_bytes(8, "big") + data[k * width:(k + 1) * width],
                                    digest_size=8).digest(), "big")
        out.append(parent)
    return out


Outcome = Literal["applied", "duplicate", "gap"]


@dataclass(frozen=True, slots=True)
class Offer:
    """What ``KVBlockIndex.offer`` did: ``expected`` is the next sequence number it wants."""

    outcome: Outcome
    expected: int
    restarted: bool = False


@dataclass(slots=True)
class ReplicaBlocks:
    """The index of one replica."""

    refs: dict[Hashable, int] = field(default_factory=dict)
    digest_of: dict[Hashable, int] = field(default_factory=dict)
    by_digest: dict[int, Hashable] = field(default_factory=dict)
    #: sequence number of the last applied batch (None: nothing yet)
    last_seq: int | None = None
    #: every block the replica holds is known (history from seq 0 or since a clear)
    synced: bool = False
    #: highest seq offered by the live stream (a live seq at or below it: the publisher restarted)
    live_high: int = -1
    #: block size of the last ``BlockStored`` (0: none seen)
    block_size: int = 0
    batches: int = 0
    gaps: int = 0
    #: digests that stopped matching since ``take_removed`` (for ``PrefixTracker``); bounded:
    #: past ``REMOVED_LOG_LIMIT`` it is dropped and ``resets`` counts up instead
    removed: list[int] = field(default_factory=list)
    #: bumped whenever matches may have shrunk without being logged (clear, resync, log overflow)
    resets: int = 0

    def clear(self) -> None:
        self.refs.clear()
        self.digest_of.clear()
        self.by_digest.clear()
        self.removed.clear()
        self.resets += 1

    def take_removed(self) -> tuple[int, list[int]]:
        """(``resets``, the digests removed since the last call), and forget them."""
        out = self.removed
        self.removed = []
        return self.resets, out

    def apply(self, batch: KVEventBatch) -> None:
        for ev in batch.events:
            if isinstance(ev, BlockStored):
                self._stored(ev)
            elif isinstance(ev, BlockRemoved):
                self._removed(ev.block_hashes)
            elif isinstance(ev, AllBlocksCleared):
                self.clear()
                self.synced = True
        self.batches += 1

    def _stored(self, ev: BlockStored) -> None:
        bs = ev.block_size
        if bs >= 1:
            self.block_size = bs
        known = bs >= 1 and len(ev.token_ids) >= len(ev.block_hashes) * bs
        parent: int | None = ROOT_DIGEST
        if ev.parent_block_hash is not None:
            parent = self.digest_of.get(ev.parent_block_hash)
        refs, digest_of, by_digest = self.refs, self.digest_of, self.by_digest
        toks = ev.token_ids
        for k, h in enumerate(ev.block_hashes):
            refs[h] = refs.get(h, 0) + 1
            if not known or parent is None:
                parent = None  # content unknown from here on: the block counts, but matches nothing
                continue
            d = digest_of.get(h)
            if d is None:
                d = _digest(parent, toks[k * bs:(k + 1) * bs])
                digest_of[h] = d
                by_digest.setdefault(d, h)
            parent = d

    def _removed(self, hashes: Iterable[Hashable]) -> None:
        refs, digest_of, by_digest = self.refs, self.digest_of, self.by_digest
        for h in hashes:
            n = refs.get(h)
            if n is None:
                continue  # stored before our history began (only while not synced)
            if n > 1:
                refs[h] = n - 1
                continue
            del refs[h]
            d = digest_of.pop(h, None)
            if d is not None and by_digest.get(d) == h:
                del by_digest[d]
                self.removed.append(d)
        if len(self.removed) > REMOVED_LOG_LIMIT:
            self.removed.clear()
            self.resets += 1

    def prefix_blocks(self, digests: Sequence[int]) -> int:
        by_digest = self.by_digest
        n = 0
        for d in digests:
            if d not in by_digest:
                break
            n += 1
        return n


class KVBlockIndex:
    """Block residency of every replica that publishes KV events."""

    def __init__(self) -> None:
        self.replicas: dict[str, ReplicaBlocks] = {}

    def _get(self, replica: str) -> ReplicaBlocks:
        r = self.replicas.get(replica)
        if r is None:
            r = self.replicas[replica] = ReplicaBlocks()
        return r

    def expected(self, replica: str) -> int:
        r = self.replicas.get(replica)
        return 0 if r is None or r.last_seq is None else r.last_seq + 1

    def offer(self, replica: str, seq: int, batch: KVEventBatch, *, live: bool = True) -> Offer:
        """Apply ``batch`` if it is the next one of ``replica`` (see the module docstring)."""
        if seq < 0:
            raise ValueError(f"sequence numbers are >= 0, got {seq}")
        r = self._get(replica)
        restarted = False
        if live:
            if seq <= r.live_high:
                # a live stream never repeats itself: the publisher restarted and counts from 0
                r.clear()
                r.last_seq = None
                r.synced = False
                restarted = True
            r.live_high = seq
        if r.last_seq is not None and seq <= r.last_seq:
            return Offer("duplicate", r.last_seq + 1)
        want = 0 if r.last_seq is None else r.last_seq + 1
        if seq != want:
            r.gaps += 1
            return Offer("gap", want, restarted)
        r.apply(batch)
        if seq == 0:
            r.synced = True  # the whole history, from the publisher's empty cache
        r.last_seq = seq
        return Offer("applied", seq + 1, restarted)

    def resync(self, replica: str, next_seq: int) -> None:
        """Give up on the batches before ``next_seq`` (replay could not supply them): the
        replica's blocks are unknown until it clears its cache; follow it from ``next_seq``."""
        r = self._get(replica)
        r.clear()
        r.synced = False
        r.last_seq = next_seq - 1 if next_seq > 0 else None

    def start_empty(self, replica: str) -> None:
        """The replica's replay socket holds no batch at all: it has published nothing since it
        started, so its cache is empty as far as events go (known, until its batch 0 arrives)."""
        r = self._get(replica)
        if r.last_seq is None:
            r.synced = True

    def synced(self, replica: str) -> bool:
        r = self.replicas.get(replica)
        return r is not None and r.synced

    def prefix_blocks(self, replica: str, digests: Sequence[int]) -> int | None:
        """How many leading blocks of ``digests`` the replica holds; None when its blocks are
        not known (no events yet, or an unrecoverable gap)."""
        r = self.replicas.get(replica)
        if r is None or not r.synced:
            return None
        return r.prefix_blocks(digests)

    def resident(self, replica: str) -> dict[Hashable, int]:
        """Every resident hash of ``replica`` with its reference count (a copy)."""
        r = self.replicas.get(replica)
        return {} if r is None else dict(r.refs)


class PrefixTracker:
    """``KVBlockIndex.prefix_blocks`` of many registered chains (one per session) on every replica,
    kept current incrementally: a match shrinks only where a removed digest sits in the chain
    (``ReplicaBlocks.removed``, looked up through an inverted map digest -> (chain, position)) and
    grows by walking on from where it stopped, so a refresh costs O(removals + chains), not
    O(chains x matched blocks). The results equal ``prefix_blocks`` (tested)."""

    def __init__(self, index: KVBlockIndex) -> None:
        self.index = index
        self.chains: dict[str, list[int]] = {}
        self._owners: dict[int, dict[str, int]] = {}
        self._memo: dict[tuple[str, str], int] = {}
        self._resets: dict[str, int] = {}

    def set_chain(self, key: str, digests: list[int]) -> None:
        self.drop(key)
        self.chains[key] = digests
        owners = self._owners
        for pos, d in enumerate(digests):
            o = owners.get(d)
            if o is None:
                owners[d] = {key: pos}
            else:
                o[key] = pos

    def drop(self, key: str) -> None:
        old = self.chains.pop(key, None)
        if old is None:
            return
        owners = self._owners
        for d in old:
            o = owners.get(d)
            if o is not None:
                o.pop(key, None)
                if not o:
                    del owners[d]
        for rid in self.index.replicas:  # memo entries exist only for replicas of the index
            self._memo.pop((key, rid), None)

    def sync(self) -> None:
        """Fold every replica's removals since the last call into the matches."""
        memo, owners = self._memo, self._owners
        for rid, rb in self.index.replicas.items():
            resets, removed = rb.take_removed()
            if self._resets.get(rid) != resets:
                self._resets[rid] = resets
                for mk in [mk for mk in memo if mk[1] == rid]:
                    del memo[mk]
                continue
            for d in removed:
                o = owners.get(d)
                if o is None:
                    continue
                for key, pos in o.items():
                    n = memo.get((key, rid))
                    if n is not None and pos < n:
                        memo[(key, rid)] = pos

    def matched(self, key: str, replica: str) -> int | None:
        """Leading blocks of chain ``key`` that ``replica`` holds (call ``sync`` first); None when
        the replica's blocks are unknown or the chain is not registered."""
        digests = self.chains.get(key)
        rb = self.index.replicas.get(replica)
        if digests is None or rb is None or not rb.synced:
            return None
        if self._resets.get(replica) != rb.resets:  # never synced against this replica state
            return rb.prefix_blocks(digests)
        by_digest = rb.by_digest
        n = self._memo.get((key, replica), 0)
        limit = len(digests)
        while n < limit and digests[n] in by_digest:
            n += 1
        self._memo[(key, replica)] = n
        return n


__all__ = ["ROOT_DIGEST", "KVBlockIndex", "Offer", "PrefixTracker", "ReplicaBlocks", "block_digests"]
