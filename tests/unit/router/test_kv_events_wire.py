"""The KV-event wire forms vLLM has published, built by hand (not with our structs), decode to the
same batch; the emulator encodes the current one (vLLM #42892: a positional batch with its DP
rank, each event a map tagged under "type")."""

from __future__ import annotations

import msgspec
import pytest

from services.common.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    KVEventDecodeError,
    decode_batch,
    encode_batch,
)

TOKENS = list(range(32))
EXPECTED = [BlockStored([11, 12], None, TOKENS, 16, None), BlockRemoved([11]), AllBlocksCleared()]

# vLLM >= #42892 (0.26 captured in volcano-sh/kthena#1535): extra fields vLLM added over time included
CURRENT = [1.5, [{"type": "BlockStored", "block_hashes": [11, 12], "parent_block_hash": None, "token_ids": TOKENS,
                  "block_size": 16, "lora_id": None, "medium": "GPU", "lora_name": None, "extra_keys": [None, None],
                  "group_idx": 0, "kv_cache_spec_kind": "full_attention"},
                 {"type": "BlockRemoved", "block_hashes": [11], "medium": "GPU", "group_idx": 0},
                 {"type": "AllBlocksCleared"}], 0]
# vLLM before #42892: everything positional
LEGACY = [1.5, [["BlockStored", [11, 12], None, TOKENS, 16, None], ["BlockRemoved", [11]], ["AllBlocksCleared"]]]
# a batch that is itself a map
ALL_MAP = {"ts": 1.5, "events": CURRENT[1]}


@pytest.mark.parametrize("wire", [CURRENT, LEGACY, ALL_MAP, CURRENT[:2]], ids=["current", "legacy", "all-map", "no-rank"])
def test_every_form_decodes_to_the_same_batch(wire: object) -> None:
    batch = decode_batch(msgspec.msgpack.encode(wire))
    assert batch.ts == 1.5 and batch.events == EXPECTED


def test_encoder_writes_the_current_form() -> None:
    raw = msgspec.msgpack.decode(encode_batch(KVEventBatch(1.5, EXPECTED)))
    assert raw == CURRENT
    assert msgspec.msgpack.decode(encode_batch(KVEventBatch(2.0, []), data_parallel_rank=3)) == [2.0, [], 3]


@pytest.mark.parametrize("wire", [[1.5, [{"type": "Bogus"}], 0], [1.5, [{"block_hashes": [1]}], 0], {"ts": 1.5}, "x"])
def test_anything_else_is_a_decode_error(wire: object) -> None:
    with pytest.raises(KVEventDecodeError):
        decode_batch(msgspec.msgpack.encode(wire))
