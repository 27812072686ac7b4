"""Token content and vLLM-style chained block hashes.

vLLM V1 identifies a full KV block by ``hash((parent_block_hash, block_tokens, extra_keys))``
(vllm ``docs/design/prefix_caching.md``), so two requests share a cached block exactly when
their token prefixes up to the end of that block are identical. We keep that chaining but
make the *content key* of a block cheap to produce:

- real token ids (the ``tao vllm-sim`` word tokenizer): key = the tuple of the block's ids;
- synthetic content (trace-driven load, docs/simulation.md#synthetic-token-content): token ``i`` of a request is
  ``synthetic_token_id(source(i), i)`` where ``source(i)`` is the shared-prefix id for
  ``i < system_prompt_tokens`` (when a shared prefix is given) and the session id otherwise.
  A block's tokens are therefore fully determined by ``(source keys, block index)``, which is
  the key we hash instead of 16 ints.

Both kinds go through the same ``chain_hash(parent, key)``. Python's hash of tuples of ints is
not salted, so hashes are reproducible across processes (string ids are first turned into
64-bit ints with blake2b).

Invariant: ``content.block_hashes(n)`` returns a list whose first ``n`` entries are the chained
hashes of blocks ``0..n-1`` (the list may be longer and may be shared between requests of the
same session; callers must not mutate it).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from typing import Protocol

from services.common.vocabulary import DEFAULT_BLOCK_SIZE

BLOCK_SIZE = DEFAULT_BLOCK_SIZE
"""vLLM's default KV block size in tokens (CacheConfig.block_size; one definition, in
``services.common.vocabulary``); an engine's own is ``Profile.block_size``."""

VOCAB_SIZE = 32768
"""Size of the emulator's token-id space (synthetic ids and the word tokenizer share it)."""

_MASK64 = (1 << 64) - 1


def stable_key(text: str) -> int:
    """A process-independent 63-bit integer for a string id."""
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


ROOT_HASH = stable_key("tao/sim/engine/root-block-hash")
"""Parent hash of block 0 (vLLM's NONE_HASH plays this role)."""


def chain_hash(parent: int, key: object) -> int:
    """Hash of a block given its parent's hash and its content key."""
    return hash((parent, key))


def _mix64(x: int) -> int:
    # splitmix64 finaliser: a fast, well-spread integer mix.
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def synthetic_token_id(source_id: str, position: int, vocab_size: int = VOCAB_SIZE) -> int:
    """Synthetic content function f(source, i): the token id at ``position`` of ``source_id``."""
    return _synthetic_id(stable_key(source_id), position, vocab_size)


def _synthetic_id(source_key: int, position: int, vocab_size: int) -> int:
    return _mix64(source_key ^ (position * 0x2545F4914F6CDD1D & _MASK64)) % vocab_size


def synthetic_source(
    session_id: str, shared_prefix_id: str | None, system_prompt_tokens: int, position: int
) -> str:
    """Which source id synthetic content assigns to ``position``."""
    if shared_prefix_id and position < system_prompt_tokens:
        return shared_prefix_id
    return session_id


class TokenContent(Protocol):
    """The token stream of one request: its prompt followed by the outputs it will produce."""

    def block_hashes(self, num_blocks: int) -> list[int]:
        """Chained hashes of the first ``num_blocks`` full blocks (list may be longer)."""
        ...

    def token_ids(self, start: int, end: int) -> list[int]:
        """Token ids at positions ``start..end-1``."""
        ...


class TokenListContent:
    """Content given as explicit token ids (prompt plus the planned output ids).

    Only blocks that lie entirely inside ``tokens`` can be hashed; the engine never asks for
    more, because it hashes only blocks that are full of computed tokens. ``block_size`` other
    than 16 exists for reproducing small worked examples.
    """

    __slots__ = ("_hashes", "block_size", "tokens")

    memo_key = None  # no cross-request lookup memo for explicit token lists

    def __init__(self, tokens: Sequence[int], block_size: int = BLOCK_SIZE) -> None:
        self.tokens: tuple[int, ...] = tuple(tokens)
        self.block_size = block_size
        self._hashes: list[int] = []

    def block_hashes(self, num_blocks: int) -> list[int]:
        hashes = self._hashes
        have = len(hashes)
        if have < num_blocks:
            bs = self.block_size
            limit = min(num_blocks, len(self.tokens) // bs)
            toks = self.tokens
            parent = hashes[-1] if hashes else ROOT_HASH
            for k in range(have, limit):
                parent = hash((parent, toks[k * bs : (k + 1) * bs]))
                hashes.append(parent)
        return hashes

    def token_ids(self, start: int, end: int) -> list[int]:
        return list(self.tokens[start:end])


class SyntheticContent:
    """Contract-B content of one session (optionally behind a shared system prefix).

    The stream is unbounded: prompt token ``i`` and output token ``j`` (at position
    ``prompt_tokens + j``) both come from ``synthetic_token_id``, so the next turn of the same
    session, whose prompt is the previous prompt + output + a new append, hits every full block
    the previous turn computed.
    """

    __slots__ = ("_hashes", "_sess_key", "_shared_key", "block_size", "session_id", "shared_prefix_id",
                 "system_prompt_tokens")

    def __init__(
        self,
        session_id: str,
        shared_prefix_id: str | None = None,
        system_prompt_tokens: int = 0,
        *,
        _hashes: list[int] | None = None,
        block_size: int = BLOCK_SIZE,
    ) -> None:
        if system_prompt_tokens < 0:
            raise ValueError(f"system_prompt_tokens must be >= 0, got {system_prompt_tokens}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size  # the engine's: where a block straddles the shared prefix
        self.session_id = session_id
        self.shared_prefix_id = shared_prefix_id or None
        self.system_prompt_tokens = system_prompt_tokens if self.shared_prefix_id else 0
        self._sess_key = stable_key(session_id)
        self._shared_key = stable_key(self.shared_prefix_id) if self.shared_prefix_id else 0
        self._hashes: list[int] = [] if _hashes is None else _hashes

    @property
    def memo_key(self) -> tuple[str, str | None, int]:
        """Identifies the chain: equal keys mean equal block hashes."""
        return (self.session_id, self.shared_prefix_id, self.system_prompt_tokens)

    def block_hashes(self, num_blocks: int) -> list[int]:
        hashes = self._hashes
        have = len(hashes)
        if have < num_blocks:
            shared_key = self._shared_key
            sess_key = self._sess_key
            sys_tokens = self.system_prompt_tokens
            bs = self.block_size
            full_shared = sys_tokens // bs  # blocks entirely inside the shared prefix
            mixed_key = (shared_key, sess_key, sys_tokens)
            parent = hashes[-1] if hashes else ROOT_HASH
            for k in range(have, num_blocks):
                if k < full_shared:
                    parent = hash((parent, (shared_key, k)))
                elif k * bs < sys_tokens:
                    parent = hash((parent, (mixed_key, k)))
                else:
                    parent = hash((parent, (sess_key, k)))
                hashes.append(parent)
        return hashes

    def token_ids(self, start: int, end: int) -> list[int]:
        out: list[int] = []
        for i in range(start, end):
            key = self._shared_key if i < self.system_prompt_tokens else self._sess_key
            out.append(_synthetic_id(key, i, VOCAB_SIZE))
        return out


RECOUNT_EVERY = 256  # ChainCache: full recount of the hashes held, every this many hand-outs


class ChainCache:
    """Shares one growing hash chain per (session, shared prefix, system length) across turns.

    A session's turn n+1 then only hashes the blocks its turn n did not reach. Bounded LRU over
    chains so a long-running replica does not grow without limit (a dropped chain is simply
    recomputed, with identical values).
    """

    def __init__(self, max_chains: int = 16384, max_hashes: int = 2_000_000, block_size: int = BLOCK_SIZE) -> None:
        """``block_size``: the KV block size of the engine the chains are for (one per cache)."""
        if max_chains < 1 or max_hashes < 1 or block_size < 1:
            raise ValueError("max_chains, max_hashes and block_size must be >= 1")
        self.block_size = block_size
        self._max = max_chains
        self._max_hashes = max_hashes
        # key -> (the chain, its length when last counted into ``_total``)
        self._chains: OrderedDict[tuple[str, str | None, int], tuple[list[int], int]] = OrderedDict()
        self._total = 0
        self._calls = 0
        self._last: tuple[str, str | None, int] | None = None

    def __len__(self) -> int:
        return len(self._chains)

    @property
    def stored_hashes(self) -> int:
        """Hashes held, as counted when each chain was last handed out (chains grow in the
        caller's hands between calls, by at most one request's prompt)."""
        return self._total

    def synthetic(
        self, session_id: str, shared_prefix_id: str | None = None, system_prompt_tokens: int = 0
    ) -> SyntheticContent:
        shared = shared_prefix_id or None
        key = (session_id, shared, system_prompt_tokens if shared else 0)
        chains = self._chains
        self._calls += 1
        if self._calls % RECOUNT_EVERY == 0:  # chains grow in their holders' hands: recount all
            for k, (h, _) in chains.items():
                chains[k] = (h, len(h))
            self._total = sum(len(h) for h, _ in chains.values())
        elif self._last is not None and self._last in chains:  # the chain handed out last grew most
            h, counted = chains[self._last]
            self._total += len(h) - counted
            chains[self._last] = (h, len(h))
        entry = chains.get(key)
        if entry is None:
            hashes: list[int] = []
            chains[key] = (hashes, 0)
        else:
            hashes, counted = entry
            self._total += len(hashes) - counted
            chains[key] = (hashes, len(hashes))
            chains.move_to_end(key)
        self._last = key
        # bounded by chains and by hashes held (a soak of ever-new sessions grew a replica's
        # RSS by ~140 MB per 10 minutes under the chain bound alone)
        while len(chains) > 1 and (len(chains) > self._max or self._total > self._max_hashes):
            _, (_, dropped) = chains.popitem(last=False)
            self._total -= dropped
        return SyntheticContent(session_id, shared, system_prompt_tokens, _hashes=hashes, block_size=self.block_size)

    def forget(self, session_id: str) -> None:
        """Drop every chain of a finished session."""
        for key in [k for k in self._chains if k[0] == session_id]:
            self._total -= self._chains.pop(key)[1]


DEFAULT_CHAINS = ChainCache()


def synthetic_content(
    session_id: str, shared_prefix_id: str | None = None, system_prompt_tokens: int = 0
) -> SyntheticContent:
    """Contract-B content backed by the process-wide chain cache."""
    return DEFAULT_CHAINS.synthetic(session_id, shared_prefix_id, system_prompt_tokens)
