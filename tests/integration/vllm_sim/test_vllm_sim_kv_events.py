"""`tao vllm-sim` publishes vLLM's KV-cache events over real ZMQ (loopback TCP, ephemeral ports) and
the router's subscriber (``services/router/kv_events.py``) keeps its block index equal to the
engine's true residency: from the start, after a late join (replay from 0), after lost batches
(a gap refilled from the replay socket), and after a prefix-cache reset (AllBlocksCleared)."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest
import structlog
import zmq
import zmq.asyncio

from services.common.kv_events import (
    BlockStored,
    KVEventsConfig,
    KvEventSource,
    decode_batch,
    external_hash,
    seq_from_bytes,
)
from services.router.core.kv_index import KVBlockIndex, block_digests
from services.router.kv_events import ReplicaSubscriber, fetch_replay
from services.sim.engine.tokens import SyntheticContent
from services.sim.vllm_sim.server import RunningSim, start_vllm_sim

FAST = 2000.0
REPO = Path(__file__).resolve().parents[3]
CONFIG = KVEventsConfig(enable_kv_cache_events=True, publisher="zmq", endpoint="tcp://127.0.0.1:*",
                        replay_endpoint="tcp://127.0.0.1:*", topic="kv")


@pytest.fixture
async def kv_sim() -> AsyncIterator[RunningSim]:
    # 120 blocks (1920 tokens): a few 500-token sessions already evict each other
    async with start_vllm_sim("qwen3-32b-h100x2", port=0, time_scale=FAST, num_gpu_blocks=120,
                              max_model_len=1800, kv_events=CONFIG) as s:
        yield s


def _source(sim: RunningSim) -> KvEventSource:
    pub = sim.server.runner.kv_publisher
    assert pub is not None
    return KvEventSource(endpoint=pub.endpoint, replay_endpoint=pub.replay_endpoint, topic="kv")


async def _chat(sim: RunningSim, session: str, prompt: int, out: int = 8, shared: str | None = None) -> None:
    body: dict[str, Any] = {"messages": [{"role": "user", "content": "x"}], "max_tokens": out,
                            "tao_synthetic": {"session_id": session, "prompt_tokens": prompt,
                                              "shared_prefix_id": shared, "system_prompt_tokens": 128 if shared else 0}}
    async with aiohttp.ClientSession() as http:
        async with http.post(sim.base_url + "/v1/chat/completions", data=json.dumps(body),
                             headers={"Content-Type": "application/json"}) as r:
            assert r.status == 200, await r.text()


async def _until(cond: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not cond():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def _matches(index: KVBlockIndex, sim: RunningSim) -> bool:
    # the wire carries vLLM's unsigned hashes (external_hash) of the engine's signed ones
    engine = {external_hash(h): n for h, n in sim.engine.pool.cached_hash_counts().items()}
    return index.synced("r0") and index.resident("r0") == engine


async def _workload(sim: RunningSim, rounds: int, sessions: int = 4) -> None:
    for t in range(rounds):
        await asyncio.gather(*(_chat(sim, f"s{i}", 300 + 200 * t, shared="sys" if i % 2 else None)
                               for i in range(sessions)))


async def _subscribe(sim: RunningSim, index: KVBlockIndex) -> tuple[ReplicaSubscriber, asyncio.Task[None],
                                                                     zmq.asyncio.Context]:
    ctx = zmq.asyncio.Context()
    sub = ReplicaSubscriber(index, "r0", _source(sim), ctx, 2.0, structlog.get_logger("test"))
    return sub, asyncio.create_task(sub.run()), ctx


async def _close(task: asyncio.Task[None], ctx: zmq.asyncio.Context) -> None:
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    ctx.destroy(linger=0)


async def test_wire_format_is_vllms(kv_sim: RunningSim) -> None:
    ctx = zmq.asyncio.Context()
    sock = ctx.socket(zmq.SUB)
    sock.setsockopt(zmq.SUBSCRIBE, b"kv")
    sock.connect(_source(kv_sim).endpoint)
    try:
        await asyncio.sleep(0.2)  # ZMQ slow joiner: let the subscription reach the publisher
        await _chat(kv_sim, "w", 100)
        topic, seq, payload = await asyncio.wait_for(sock.recv_multipart(), 5)
        assert topic == b"kv" and len(seq) == 8
        # vLLM's current form: [ts, [{"type": ..., fields}], dp_rank] (vLLM #42892: map events)
        raw = msgspec.msgpack.decode(payload)
        assert isinstance(raw, list) and isinstance(raw[0], float) and raw[2] == 0
        ev = raw[1][0]
        assert ev["type"] == "BlockStored" and ev["medium"] == "GPU" and ev["group_idx"] == 0
        hashes, tokens = ev["block_hashes"], ev["token_ids"]
        assert ev["parent_block_hash"] is None and ev["block_size"] == 16 and ev["lora_id"] is None
        assert len(tokens) == 16 * len(hashes) and ev["extra_keys"] == [None] * len(hashes)
        assert all(isinstance(h, int) and 0 <= h < 2**64 for h in hashes)  # vLLM's unsigned int hashes
        first = decode_batch(payload).events[0]
        assert isinstance(first, BlockStored) and first.block_hashes == hashes
        # the replay socket answers from any seq, then the end marker
        replay = await fetch_replay(ctx, _source(kv_sim).replay_endpoint or "", seq_from_bytes(seq), 5.0)
        assert replay is not None and replay[0][0] == seq_from_bytes(seq)
    finally:
        sock.close(linger=0)
        ctx.destroy(linger=0)


async def test_kv_event_sources_reports_the_bound_publisher(kv_sim: RunningSim) -> None:
    """vLLM's ``GET /kv_event_sources`` (vllm-project/vllm#55844): the publisher per DP rank with
    the ports the OS chose for ``tcp://127.0.0.1:*``; a subscriber that follows it gets events."""
    async with aiohttp.ClientSession() as http, http.get(kv_sim.base_url + "/kv_event_sources") as r:
        assert r.status == 200
        body = await r.json()
    src = _source(kv_sim)
    assert body == {"sources": [{"data_parallel_rank": 0, "endpoint": src.endpoint,
                                 "replay_endpoint": src.replay_endpoint, "topic": "kv"}]}
    assert not src.endpoint.endswith(":*") and src.endpoint.startswith("tcp://127.0.0.1:")
    index = KVBlockIndex()
    entry = body["sources"][0]
    ctx = zmq.asyncio.Context()
    source = KvEventSource(endpoint=entry["endpoint"], replay_endpoint=entry["replay_endpoint"], topic=entry["topic"])
    sub = ReplicaSubscriber(index, "r0", source, ctx, 2.0, structlog.get_logger("test"))
    task = asyncio.create_task(sub.run())
    try:
        await _chat(kv_sim, "d", 320)
        await _until(lambda: _matches(index, kv_sim) and bool(index.resident("r0")), "the index to follow the engine")
    finally:
        await _close(task, ctx)


async def test_kv_event_sources_is_empty_without_events() -> None:
    async with start_vllm_sim("qwen3-32b-h100x2", port=0, time_scale=FAST, num_gpu_blocks=120,
                              max_model_len=1800) as sim:
        async with aiohttp.ClientSession() as http, http.get(sim.base_url + "/kv_event_sources") as r:
            assert r.status == 200 and await r.json() == {"sources": []}


async def test_index_follows_the_engine_and_recovers_a_gap(kv_sim: RunningSim) -> None:
    index = KVBlockIndex()
    sub, task, ctx = await _subscribe(kv_sim, index)
    try:
        # a fresh replica has published nothing: its (empty) cache is known at once
        await _until(lambda: index.synced("r0") and index.resident("r0") == {}, "fresh replica synced")
        await _workload(kv_sim, 3)
        await _until(lambda: _matches(index, kv_sim), "index == engine residency")
        assert kv_sim.engine.num_gpu_blocks == 120 and kv_sim.engine.pool.num_evictions > 0  # it did evict
        pub = kv_sim.server.runner.kv_publisher
        assert pub is not None
        pub.drop = set(range(pub.next_seq, pub.next_seq + 3))  # lost on the wire, still in the replay buffer
        replays = sub.replays
        await _workload(kv_sim, 2)
        await _until(lambda: _matches(index, kv_sim) and index.expected("r0") == pub.next_seq,
                     "index == engine after the gap")
        assert sub.replays > replays and index.replicas["r0"].gaps >= 1
    finally:
        await _close(task, ctx)


async def test_late_subscriber_replays_from_zero_and_sees_a_reset(kv_sim: RunningSim) -> None:
    await _workload(kv_sim, 2)  # before anyone listens
    index = KVBlockIndex()
    _, task, ctx = await _subscribe(kv_sim, index)
    try:
        await _until(lambda: _matches(index, kv_sim), "late join replayed from seq 0")
        assert index.resident("r0")
        async with aiohttp.ClientSession() as http, http.post(kv_sim.base_url + "/reset_prefix_cache") as r:
            assert r.status == 200
        await _until(lambda: _matches(index, kv_sim) and not index.resident("r0"), "AllBlocksCleared applied")
    finally:
        await _close(task, ctx)


async def test_cli_flag_publishes_like_vllm(sim_spawner: Any) -> None:
    cfg = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": "tcp://127.0.0.1:*",
           "replay_endpoint": "tcp://127.0.0.1:*"}
    p = sim_spawner.spawn("--time-scale", str(FAST), "--num-gpu-blocks", "120", "--max-model-len", "1800",
                          "--kv-events-config", json.dumps(cfg))
    try:
        assert p.proc.stderr is not None
        line = ""
        for _ in range(5):
            line = p.proc.stderr.readline()
            if "kv events on" in line:
                break
        m = re.search(r"kv events on (tcp://\S+) \(replay (tcp://\S+)\)", line)
        assert m is not None, line
        index = KVBlockIndex()
        ctx = zmq.asyncio.Context()
        sub = ReplicaSubscriber(index, "r0", KvEventSource(endpoint=m.group(1), replay_endpoint=m.group(2)), ctx,
                                2.0, structlog.get_logger("test"))
        task = asyncio.create_task(sub.run())
        try:
            body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 4,
                    "tao_synthetic": {"session_id": "p", "prompt_tokens": 320}}
            async with aiohttp.ClientSession() as http, \
                    http.post(p.base_url + "/v1/chat/completions", json=body) as r:
                assert r.status == 200
            digests = block_digests(SyntheticContent("p").token_ids(0, 324), 16)
            await _until(lambda: index.prefix_blocks("r0", digests) == 20, "the 20 full blocks of the prompt")
        finally:
            await _close(task, ctx)
    finally:
        sim_spawner.stop(p)


def test_cli_rejects_a_bad_config(sim_spawner: Any) -> None:
    proc = subprocess.run([sys.executable, "-m", "services.cli", "vllm-sim", "--port", "0", "--kv-events-config",
                           '{"enable_kv_cache_events": true, "bogus": 1}'],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--kv-events-config" in proc.stderr


async def test_subscriber_survives_bad_messages() -> None:
    """Garbage on the wire (wrong frame count, bad seq, bad payload, a negative seq) is counted
    and skipped; the next good batch is applied."""
    from services.common.kv_events import BlockStored as Stored
    from services.common.kv_events import KVEventBatch, encode_batch, seq_bytes

    ctx = zmq.asyncio.Context()
    pub = ctx.socket(zmq.PUB)
    pub.bind("tcp://127.0.0.1:*")
    index = KVBlockIndex()
    sub = ReplicaSubscriber(index, "r0", KvEventSource(endpoint=pub.getsockopt_string(zmq.LAST_ENDPOINT)), ctx,
                            0.5, structlog.get_logger("test"))
    task = asyncio.create_task(sub.run())
    good = encode_batch(KVEventBatch(0.0, [Stored([1], None, list(range(16)), 16, None)]))
    try:
        bad = [(b"", seq_bytes(0)), (b"", b"\x00", good), (b"", seq_bytes(0), b"\xc1garbage"),
               (b"", seq_bytes(-5), good), (b"", seq_bytes(0), b"\x92\x01")]

        async def sent_and_applied() -> bool:
            for frames in bad:
                await pub.send_multipart(frames)
            await pub.send_multipart((b"", seq_bytes(0), good))
            await asyncio.sleep(0.05)
            return index.resident("r0") == {1: 1}

        deadline = asyncio.get_running_loop().time() + 10
        while not await sent_and_applied():  # resend until the subscription has reached the publisher
            assert asyncio.get_running_loop().time() < deadline, "good batch never applied"
        assert sub.bad >= len(bad) and sub.failures == 0 and not task.done()
        assert index.synced("r0")
    finally:
        await _close(task, ctx)


async def test_tao_up_stack_wires_replicas_and_router_over_ipc(tmp_path: Path) -> None:
    """``StackConfig(kv_events=True)`` (``tao up --kv-events``): each replica process publishes on
    ipc:// sockets, and the router's ``kv_events`` setting names them under the replica ids the
    router derives from their URLs."""
    from services.router.replicas import replica_id_for
    from services.up.stack import Stack, StackConfig

    stack = Stack(StackConfig(replicas=2, time_scale=FAST, num_gpu_blocks=200, log_dir=tmp_path, kv_events=True))
    try:
        urls = await asyncio.to_thread(stack.start_replicas)
        stack._routed = urls
        wiring = stack._router_kv_events
        assert set(wiring) == {replica_id_for(u) for u in urls}
        index = KVBlockIndex()
        ctx = zmq.asyncio.Context()
        tasks = [asyncio.create_task(ReplicaSubscriber(index, rid, KvEventSource(**src), ctx, 2.0,
                                                       structlog.get_logger("test")).run())
                 for rid, src in wiring.items()]
        try:
            body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 4,
                    "tao_synthetic": {"session_id": "u", "prompt_tokens": 160}}
            async with aiohttp.ClientSession() as http:
                for u in urls:
                    async with http.post(u + "/v1/chat/completions", json=body) as r:
                        assert r.status == 200
            digests = block_digests(SyntheticContent("u").token_ids(0, 164), 16)
            await _until(lambda: all(index.prefix_blocks(rid, digests) == 10 for rid in wiring),
                         "both replicas' events over ipc")
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            ctx.destroy(linger=0)
    finally:
        await asyncio.to_thread(stack.stop)
    assert stack._kv_dir is None
