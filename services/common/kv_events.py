"""vLLM's KV-cache events: the wire schema, defined once for the publisher (``tao vllm-sim``)
and the subscriber (the router's block index).

Schema and transport follow vLLM's ``ZmqEventPublisher`` (github.com/vllm-project/vllm,
``vllm/distributed/kv_events.py``; the configuration is ``KVEventsConfig`` in
``vllm/config/kv_events.py``):

- a batch per engine step, msgpack-encoded with msgspec: the batch is a positional array
  ``[ts, events, data_parallel_rank]`` (``EventBatch`` is ``array_like``) and, since vLLM
  #42892 (merged 2026-06-09, "Switch event structs from array to map encoding"), each event a
  map tagged by its class name under ``"type"``: ``{"type": "BlockStored", "block_hashes",
  "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name",
  "extra_keys", "group_idx", "kv_cache_spec_kind"}``, ``{"type": "BlockRemoved",
  "block_hashes", "medium", "group_idx"}``, ``{"type": "AllBlocksCleared"}`` (fields with a
  default omitted when at it). ``encode_batch`` writes that form, as vLLM 0.26 does (a
  captured batch: volcano-sh/kthena#1535);
- the PUB socket sends a multipart ``[topic, seq, payload]``, ``seq`` 8 bytes big-endian,
  0, 1, 2, … per batch;
- the optional replay ROUTER socket answers a request ``[b"", start_seq (8 bytes BE)]`` with
  ``[b"", seq, payload]`` for every buffered batch whose ``seq >= start_seq``, then the end
  marker ``[b"", -1 (8 bytes BE, signed), b""]``.

``BlockStored`` carries the chained block hashes of consecutive newly full blocks, the hash of
the block before the first one (``None`` at the start of a sequence) and the token ids of all
of them. ``BlockRemoved`` lists evicted hashes, one event per evicted physical block (a hash
cached in two blocks is stored twice and removed twice). ``decode_batch`` reads every form
vLLM has published: the current one, the older all-positional one (events as arrays
``["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id]``) and a
batch that is itself a map; extra fields are ignored. The structs below are the in-memory form
(and the all-positional wire form).

Pure (no I/O): structs, encoders, the config model.
"""

from __future__ import annotations

import json
from typing import Any, Literal

import msgspec
from pydantic import BaseModel, ConfigDict, Field, ValidationError

END_SEQ = -1
"""Sequence number of the replay socket's end-of-replay marker."""
END_SEQ_BYTES = END_SEQ.to_bytes(8, "big", signed=True)


BlockHash = int | bytes
"""vLLM's ``ExternalBlockHash``: an int, or the digest bytes of a sha256 hashing mode."""


class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    """Base of the three KV-cache events (the tag is the class name)."""


class BlockStored(KVCacheEvent):
    block_hashes: list[BlockHash]
    parent_block_hash: BlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[BlockHash]


class AllBlocksCleared(KVCacheEvent):
    pass


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


class KVEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[KVEvent]


# The map-encoded form of newer vLLM versions (same tags, extra optional fields ignored).
class _MapEvent(msgspec.Struct, gc=False, tag=True):
    pass


class _MapBlockStored(_MapEvent, tag="BlockStored"):
    block_hashes: list[BlockHash]
    parent_block_hash: BlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None


class _MapBlockRemoved(_MapEvent, tag="BlockRemoved"):
    block_hashes: list[BlockHash]


class _MapAllBlocksCleared(_MapEvent, tag="AllBlocksCleared"):
    pass


class _MapBatch(msgspec.Struct, gc=False):
    ts: float
    events: list[_MapBlockStored | _MapBlockRemoved | _MapAllBlocksCleared]


# The current wire form (vLLM #42892): positional batch, map events. What the emulator publishes.
_MEDIUM_GPU = "GPU"  # vLLM's MEDIUM_GPU
_FULL_ATTENTION = "full_attention"  # the kv_cache_spec_kind of a full-attention model's group


class _WireEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class _WireBlockStored(_WireEvent, tag="BlockStored"):
    block_hashes: list[BlockHash]
    parent_block_hash: BlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


class _WireBlockRemoved(_WireEvent, tag="BlockRemoved"):
    block_hashes: list[BlockHash]
    medium: str | None
    group_idx: int | None = None


class _WireAllBlocksCleared(_WireEvent, tag="AllBlocksCleared"):
    pass


class _WireBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[_WireBlockStored | _WireBlockRemoved | _WireAllBlocksCleared]
    data_parallel_rank: int | None = None


# Reading the current form: a positional batch of map events (extra fields ignored).
class _MixedBatch(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[_MapBlockStored | _MapBlockRemoved | _MapAllBlocksCleared]
    data_parallel_rank: int | None = None


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(KVEventBatch)
_MIXED_DECODER = msgspec.msgpack.Decoder(_MixedBatch)
_MAP_DECODER = msgspec.msgpack.Decoder(_MapBatch)


def _wire_event(e: KVEvent) -> _WireBlockStored | _WireBlockRemoved | _WireAllBlocksCleared:
    if isinstance(e, BlockStored):
        # vLLM sends one extra_keys entry per block (None without multimodal inputs, LoRA or salt)
        return _WireBlockStored(e.block_hashes, e.parent_block_hash, e.token_ids, e.block_size, e.lora_id,
                                _MEDIUM_GPU, None, [None] * len(e.block_hashes), 0, _FULL_ATTENTION)
    if isinstance(e, BlockRemoved):
        return _WireBlockRemoved(e.block_hashes, _MEDIUM_GPU, 0)
    return _WireAllBlocksCleared()


class KVEventDecodeError(ValueError):
    """A payload that is not a KV event batch."""


_U64 = (1 << 64) - 1


def external_hash(h: BlockHash) -> BlockHash:
    """A block hash as vLLM puts it on the wire: bytes as they are, an int as an unsigned 64-bit
    value (vLLM's ``maybe_convert_block_hash`` sends the last 8 bytes of the sha256 digest,
    big-endian, so its int hashes are never negative; consumers such as vllm-router reject a
    negative one). The emulator's engine hashes with Python's signed ``hash``; two's complement
    keeps the mapping one to one."""
    return h & _U64 if isinstance(h, int) else h


def external_event(e: KVEvent) -> KVEvent:
    """``e`` with its block hashes as vLLM sends them (``external_hash``)."""
    if isinstance(e, BlockStored):
        parent = None if e.parent_block_hash is None else external_hash(e.parent_block_hash)
        return BlockStored([external_hash(h) for h in e.block_hashes], parent, e.token_ids, e.block_size, e.lora_id)
    if isinstance(e, BlockRemoved):
        return BlockRemoved([external_hash(h) for h in e.block_hashes])
    return e


def encode_batch(batch: KVEventBatch, data_parallel_rank: int = 0) -> bytes:
    """``batch`` in vLLM's current wire form (the module docstring); vLLM's publisher stamps
    its DP rank on every batch."""
    return _ENCODER.encode(_WireBatch(batch.ts, [_wire_event(e) for e in batch.events], data_parallel_rank))


def _from_map(events: list[_MapBlockStored | _MapBlockRemoved | _MapAllBlocksCleared]) -> list[KVEvent]:
    out: list[KVEvent] = []
    for e in events:
        if isinstance(e, _MapBlockStored):
            out.append(BlockStored(e.block_hashes, e.parent_block_hash, e.token_ids, e.block_size, e.lora_id))
        elif isinstance(e, _MapBlockRemoved):
            out.append(BlockRemoved(e.block_hashes))
        else:
            out.append(AllBlocksCleared())
    return out


def decode_batch(payload: bytes) -> KVEventBatch:
    """A batch in any of vLLM's wire forms; ``KVEventDecodeError`` for anything else."""
    try:
        mixed = _MIXED_DECODER.decode(payload)
        return KVEventBatch(mixed.ts, _from_map(mixed.events))
    except (msgspec.DecodeError, msgspec.ValidationError):
        pass
    try:
        return _DECODER.decode(payload)
    except (msgspec.DecodeError, msgspec.ValidationError):
        pass
    try:
        m = _MAP_DECODER.decode(payload)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise KVEventDecodeError(f"not a KV event batch: {exc}") from None
    return KVEventBatch(m.ts, _from_map(m.events))


def seq_bytes(seq: int) -> bytes:
    return seq.to_bytes(8, "big", signed=True)


def seq_from_bytes(data: bytes) -> int:
    if len(data) != 8:
        raise KVEventDecodeError(f"sequence number must be 8 bytes, got {len(data)}")
    return int.from_bytes(data, "big", signed=True)


class KVEventsConfig(BaseModel):
    """vLLM's ``--kv-events-config`` JSON (``vllm/config/kv_events.py``, ``KVEventsConfig``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    enable_kv_cache_events: bool = False
    publisher: Literal["null", "zmq"] | None = None
    endpoint: str = "tcp://*:5557"
    replay_endpoint: str | None = None
    buffer_steps: int = Field(default=10_000, ge=1)
    hwm: int = Field(default=100_000, ge=0)
    max_queue_size: int = Field(default=100_000, ge=1)
    topic: str = ""

    @property
    def publishes(self) -> bool:
        """Events are published over ZMQ (vLLM: publisher defaults to zmq when enabled)."""
        kind = self.publisher or ("zmq" if self.enable_kv_cache_events else "null")
        return self.enable_kv_cache_events and kind == "zmq"

    @classmethod
    def parse(cls, text: str) -> KVEventsConfig:
        """From the CLI flag's JSON text; ``ValueError`` with a one-line reason."""
        try:
            data: Any = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"--kv-events-config: not JSON: {exc}") from None
        if not isinstance(data, dict):
            raise ValueError("--kv-events-config: expected a JSON object")
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise ValueError(f"--kv-events-config: {where}: {first['msg']}") from None


class KvEventSource(BaseModel):
    """Where one replica publishes its KV events, as a subscriber connects to them (the router's
    ``kv_events`` setting; the replica runs with ``--kv-events-config``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    endpoint: str = Field(min_length=6, description="PUB address to connect to, e.g. tcp://10.0.0.5:5557")
    replay_endpoint: str | None = Field(default=None, description="replay ROUTER address, e.g. tcp://10.0.0.5:5558")
    topic: str = ""


__all__ = [
    "END_SEQ", "END_SEQ_BYTES", "AllBlocksCleared", "BlockHash", "BlockRemoved", "BlockStored", "KVCacheEvent", "KVEvent",
    "KVEventBatch", "KVEventDecodeError", "KVEventsConfig", "KvEventSource", "decode_batch", "encode_batch",
    "external_event", "external_hash", "seq_bytes",
    "seq_from_bytes",
]
