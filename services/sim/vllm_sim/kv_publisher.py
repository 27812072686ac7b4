"""The emulated replica's KV-event publisher: vLLM's ``ZmqEventPublisher`` on the sim's event loop.

Same wire behaviour as vLLM (github.com/vllm-project/vllm, ``vllm/distributed/kv_events.py``,
``ZmqEventPublisher``; schema in ``services.common.kv_events``): a PUB socket that binds when
the endpoint has a wildcard (``*``, ``::``) or is ``ipc://`` / ``inproc://`` and connects
otherwise, sends ``[topic, seq (8 bytes BE), msgpack batch]`` with seq 0, 1, 2, …, and keeps the
last ``buffer_steps`` batches for the optional replay ROUTER socket, which answers
``[b"", start_seq]`` with every buffered ``[b"", seq, payload]`` whose seq >= start_seq and the
end marker ``[b"", -1, b""]``. vLLM publishes from a thread; the emulator's engine already
runs on an asyncio loop, so sends happen there (a PUB send never blocks: past ``hwm`` queued
messages ZMQ drops, as in vLLM) and a task serves replay requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque

import zmq
import zmq.asyncio

from services.common.kv_events import (
    END_SEQ_BYTES,
    KVEvent,
    KVEventBatch,
    KVEventsConfig,
    encode_batch,
    external_event,
    seq_bytes,
    seq_from_bytes,
)


def _binds(endpoint: str) -> bool:
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


class KVEventPublisher:
    """Publishes one ``KVEventBatch`` per engine step that produced events."""

    def __init__(self, config: KVEventsConfig, ctx: zmq.asyncio.Context | None = None) -> None:
        self.config = config
        self._ctx = ctx or zmq.asyncio.Context.instance()
        self._topic = config.topic.encode("utf-8")
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=config.buffer_steps)
        self._seq = 0
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.set_hwm(config.hwm)
        self._pub.setsockopt(zmq.LINGER, 0)
        (self._pub.bind if _binds(config.endpoint) else self._pub.connect)(config.endpoint)
        self._replay: zmq.asyncio.Socket | None = None
        if config.replay_endpoint:
            self._replay = self._ctx.socket(zmq.ROUTER)
            self._replay.setsockopt(zmq.LINGER, 0)
            self._replay.bind(config.replay_endpoint)
        self._task: asyncio.Task[None] | None = None
        #: batches sent; a test may set ``drop`` to skip the PUB send of chosen seqs (still buffered)
        self.published = 0
        self.drop: set[int] = set()

    @property
    def endpoint(self) -> str:
        """The PUB socket's address (the port chosen for ``tcp://*:0``)."""
        return self._pub.getsockopt_string(zmq.LAST_ENDPOINT)

    @property
    def replay_endpoint(self) -> str | None:
        return None if self._replay is None else self._replay.getsockopt_string(zmq.LAST_ENDPOINT)

    @property
    def next_seq(self) -> int:
        return self._seq

    def start(self) -> None:
        if self._replay is not None and self._task is None:
            self._task = asyncio.create_task(self._serve_replay(), name="vllm-sim-kv-replay")

    def publish(self, events: list[KVEvent]) -> None:
        if not events:
            return
        payload = encode_batch(KVEventBatch(time.time(), [external_event(e) for e in events]))
        seq = self._seq
        self._seq += 1
        self._buffer.append((seq, payload))
        if seq in self.drop:
            return
        with contextlib.suppress(zmq.Again):  # over the high-water mark: dropped, as in vLLM
            self._pub.send_multipart((self._topic, seq_bytes(seq), payload), flags=zmq.NOBLOCK)
        self.published += 1

    async def _serve_replay(self) -> None:
        assert self._replay is not None
        sock = self._replay
        while True:
            frames = await sock.recv_multipart()
            if len(frames) != 3 or len(frames[2]) != 8:
                continue  # vLLM logs and ignores a malformed request
            client, _, start = frames
            first = seq_from_bytes(start)
            for seq, payload in list(self._buffer):
                if seq >= first:
                    await sock.send_multipart((client, b"", seq_bytes(seq), payload))
            await sock.send_multipart((client, b"", END_SEQ_BYTES, b""))

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self._pub.close(linger=0)
        if self._replay is not None:
            self._replay.close(linger=0)
