"""The predictor service over real gRPC and a real Redis (fixtures in tests/conftest.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Sequence

import grpc
import pytest
import redis.asyncio as aioredis

from services.common import keys
from services.common.clock import VirtualClock
from services.common.records import PredictionRecord
from services.common.settings import load_settings
from services.common.testing import serve_in_process
from services.predictor.convert import event_to_proto
from services.predictor.core import EventType, ToolEvent
from services.predictor.server import PredictorApp, Settings
from services.predictor.store import LOG, STATE
from tao.predictor.v1 import predictor_pb2 as pb
from tao.predictor.v1 import predictor_pb2_grpc as pbg

T0 = 1_800_000_000.0
S, P, F = EventType.STARTED, EventType.PROGRESS, EventType.FINISHED
DURABLE, DUPLICATE, REJECTED = pb.ACK_STATUS_DURABLE, pb.ACK_STATUS_DUPLICATE, pb.ACK_STATUS_REJECTED


def settings(redis_url: str, **kw: object) -> Settings:
    values: dict[str, object] = {"port": 0, "tick_s": 0.01, "exploration_probability": 0.0,
                                 "redis_startup_timeout_s": 5.0, "log_level": "warning", **kw}  # fmt: skip
    return load_settings(Settings, redis_url=redis_url, **values)


def e(t: float, typ: EventType, cid: str, seq: int, sid: str = "s1", cmd: str = "", **kw: float) -> pb.ToolEvent:
    return event_to_proto(ToolEvent(T0 + t, sid, cid, typ, "bash", cmd, seq=seq, **kw))  # type: ignore[arg-type]


class Runner:
    """A tool runner holding one bidi stream."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.stub = pbg.PredictorServiceStub(channel)
        self.call = self.stub.StreamToolEvents()

    async def send(self, events: Sequence[pb.ToolEvent]) -> list[pb.EventAck]:
        await self.call.write(pb.StreamToolEventsRequest(runner_id="test", events=events))
        resp = await asyncio.wait_for(self.call.read(), 10)
        assert resp is not grpc.aio.EOF
        return list(resp.acks)

    async def close(self) -> None:
        await self.call.done_writing()


class Watch:
    """Drains a WatchReadiness stream into a queue (cancelling a stream read would end the RPC)."""

    def __init__(self, stream: AsyncIterator[pb.WatchReadinessResponse]) -> None:
        self.queue: asyncio.Queue[pb.Prediction] = asyncio.Queue()
        self.task = asyncio.create_task(self._drain(stream))

    async def _drain(self, stream: AsyncIterator[pb.WatchReadinessResponse]) -> None:
        async for resp in stream:
            await self.queue.put(resp.prediction)

    async def next(self, timeout_s: float = 3.0) -> pb.Prediction:
        return await asyncio.wait_for(self.queue.get(), timeout_s)

    async def close(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
            await self.task


async def test_readiness_flips_at_the_right_moments_on_a_virtual_clock(redis_url: str) -> None:
    clock = VirtualClock(T0)
    st = settings(redis_url)
    r = aioredis.Redis.from_url(redis_url, decode_responses=True)
    pubsub = r.pubsub()
    await pubsub.subscribe(keys.READINESS_CHANNEL)
    async with serve_in_process("predictor", PredictorApp(st, clock), st) as running:
        async with grpc.aio.insecure_channel(running.address) as ch:
            runner = Runner(ch)
            watch = Watch(runner.stub.WatchReadiness(pb.WatchReadinessRequest(session_ids=["s1"])))
            await asyncio.sleep(0.1)  # the watcher is registered
            acks = await runner.send([e(0, S, "c1", 0, cmd="sleep 5")])  # Ê = 5.05 s
            assert [a.status for a in acks] == [DURABLE]
            first = await watch.next()
            assert (first.ready, first.ready_reason, first.evidence) == (False, "not_due", pb.EVIDENCE_PARSED_SLEEP)
            assert first.expected_duration_s == pytest.approx(5.05)

            clock.set(T0 + 4.0)  # 1.05 s before the predicted return: not yet
            with pytest.raises(TimeoutError):
                await watch.next(0.3)
            clock.set(T0 + 4.1)
            due = await watch.next()
            assert (due.ready, due.ready_reason) == (True, "due")
            clock.set(T0 + 5.6)  # past T̂ + 0.5 s: overdue, no exploration configured
            over = await watch.next()
            assert (over.ready, over.ready_reason) == (False, "overdue")
            clock.set(T0 + 5.8)
            await runner.send([e(5.8, F, "c1", 1)])
            done = await watch.next()
            assert (done.ready, done.ready_reason, done.completed) == (True, "completed", True)
            clock.set(T0 + 36.0)  # a completion counts for 30 s only
            stale = await watch.next()
            assert (stale.ready, stale.stale) == (False, True)
            await runner.close()
            await watch.close()

            # the published records are valid PredictionRecords, and every change went out on the channel
            raw = await r.hget(keys.PREDICTIONS, "s1")
            rec = PredictionRecord.model_validate_json(raw)
            assert rec.session_id == "s1" and rec.ready_reason == "stale"
            reasons = []
            for _ in range(20):  # None is also returned for the subscribe confirmation
                msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.05)
                if msg is not None:
                    reasons.append(json.loads(msg["data"])["ready_reason"])
            assert reasons == ["not_due", "due", "overdue", "completed", "stale"]
    await pubsub.aclose()
    await r.aclose()


@pytest.mark.parametrize("snapshot_interval_s", [1000.0, 0.001], ids=["from-log", "from-snapshot"])
async def test_predictor_restart_loses_no_acked_event(redis_url: str, snapshot_interval_s: float) -> None:
    clock = VirtualClock(T0 + 100)
    st = settings(redis_url, snapshot_interval_s=snapshot_interval_s)
    history = [e(10.0 * i + d, typ, f"h{i}", seq, cmd="pytest tests/a.py")
               for i in range(3) for d, typ, seq in ((0, S, 0), (2.0, F, 1))]  # fmt: skip
    running_call = [e(95, S, "run", 0, cmd="make -j4"), e(99, P, "run", 1, fraction=0.5)]
    async with serve_in_process("predictor", PredictorApp(st, clock), st) as first:
        async with grpc.aio.insecure_channel(first.address) as ch:
            runner = Runner(ch)
            acks = await runner.send(history + running_call)
            assert all(a.status == DURABLE for a in acks)
            before = (await runner.stub.GetPrediction(pb.GetPredictionRequest(session_id="s1"))).prediction
            await runner.close()
    # everything acked is in Redis: in the event log, or in the snapshot that replaced it
    r = aioredis.Redis.from_url(redis_url, decode_responses=True)
    assert (await r.llen(LOG)) == (len(history) + 2 if snapshot_interval_s > 1 else 0)
    assert (await r.hexists(STATE, "s1")) == (snapshot_interval_s < 1)
    await r.aclose()

    async with serve_in_process("predictor", PredictorApp(st, clock), st) as second:
        async with grpc.aio.insecure_channel(second.address) as ch:
            runner = Runner(ch)
            after = (await runner.stub.GetPrediction(pb.GetPredictionRequest(session_id="s1"))).prediction
            assert after == before  # same call, same expected duration, same readiness
            assert after.call_id == "run" and after.expected_duration_s == pytest.approx(8.0)
            # the runner resumes: whatever it resends was already acked -> duplicates
            acks = await runner.send(history + running_call)
            assert all(a.status == DUPLICATE for a in acks)
            # what it learned survived: a new session's first run of the command uses history
            await runner.send([e(100, S, "x", 0, sid="s2", cmd="pytest tests/a.py")])
            p2 = (await runner.stub.GetPrediction(pb.GetPredictionRequest(session_id="s2"))).prediction
            assert p2.evidence == pb.EVIDENCE_TOOL_HISTORY and p2.expected_duration_s == pytest.approx(2.0)
            await runner.close()


async def test_bad_events_are_rejected_without_closing_the_stream(redis_url: str) -> None:
    clock = VirtualClock(T0)
    st = settings(redis_url, max_command_chars=1000, max_batch_events=20)
    async with serve_in_process("predictor", PredictorApp(st, clock), st) as running:
        async with grpc.aio.insecure_channel(running.address) as ch:
            runner = Runner(ch)
            unset_type = e(0, S, "c5", 0)
            unset_type.type = pb.TOOL_EVENT_TYPE_UNSPECIFIED
            batch = [
                e(0, S, "c1", 0, cmd="ls"),
                e(0, S, "c2", 0, cmd="ls", fraction=2.0),
                e(100, S, "c3", 0, cmd="ls"),  # 100 s in the future
                e(0, S, "c4", 0, cmd="x" * 5000),
                unset_type,
                e(0, S, "c6", 0, cmd="ls", deadline_s=-1.0),
                e(0, S, "c7", 0, sid="", cmd="ls"),
                e(0.5, F, "c1", 1),
            ]
            acks = await runner.send(batch)
            assert [a.status for a in acks] == [DURABLE, REJECTED, REJECTED, REJECTED, REJECTED, REJECTED, REJECTED,
                                                DURABLE]  # fmt: skip
            reasons = [a.reason for a in acks]
            assert "fraction" in reasons[1] and "future" in reasons[2] and "command longer" in reasons[3]
            assert "type" in reasons[4] and "deadline_s" in reasons[5] and "session_id" in reasons[6]
            # contradicting an earlier event: rejected too; the stream still works afterwards
            acks = await runner.send([e(2, S, "c8", 0, cmd="ls"), e(1, F, "c8", 1), e(0.5, F, "c1", 1)])
            assert [a.status for a in acks] == [DURABLE, REJECTED, DUPLICATE]
            assert "negative duration" in acks[1].reason
            acks = await runner.send([e(0, S, f"b{i}", 0, cmd="ls") for i in range(21)])  # over the batch limit
            assert all(a.status == REJECTED and "exceeds" in a.reason for a in acks)
            acks = await runner.send([e(3, F, "c8", 1)])
            assert [a.status for a in acks] == [DURABLE]
            await runner.close()

            stub = runner.stub
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.GetPrediction(pb.GetPredictionRequest(session_id="nobody"))
            assert err.value.code() == grpc.StatusCode.NOT_FOUND
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.GetPrediction(pb.GetPredictionRequest(session_id=""))
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            unary = await stub.ReportToolEvents(pb.ReportToolEventsRequest(events=[e(4, S, "u", 0, cmd="ls")]))
            assert [a.status for a in unary.acks] == [DURABLE]


async def test_redis_restart_is_ridden_out_and_state_republished(redis_proc) -> None:  # type: ignore[no-untyped-def]
    clock = VirtualClock(T0)
    st = settings(redis_proc.url, flush_timeout_s=1.0, redis_timeout_s=0.5)
    async with serve_in_process("predictor", PredictorApp(st, clock), st) as running:
        async with grpc.aio.insecure_channel(running.address) as ch:
            runner = Runner(ch)
            assert [a.status for a in await runner.send([e(0, S, "c1", 0, cmd="sleep 9")])] == [DURABLE]
            redis_proc.kill()
            with pytest.raises(grpc.aio.AioRpcError) as err:  # not durable -> not acked
                await runner.send([e(1, P, "c1", 1, eta_s=3.0)])
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            redis_proc.start()  # empty: no persistence
            runner = Runner(ch)  # the runner reconnects and resends what was not acked
            acks = await runner.send([e(1, P, "c1", 1, eta_s=3.0)])
            assert acks[0].status in (DURABLE, DUPLICATE)
            r = aioredis.Redis.from_url(redis_proc.url, decode_responses=True)
            for _ in range(50):  # the predictor notices the wipe and republishes what it holds
                if await r.hexists(STATE, "s1"):
                    break
                await asyncio.sleep(0.1)
            rec = PredictionRecord.model_validate_json(await r.hget(keys.PREDICTIONS, "s1"))
            assert rec.expected_duration_s == pytest.approx(4.0)  # includes the progress event
            await r.aclose()
            await runner.close()
    async with serve_in_process("predictor", PredictorApp(st, clock), st) as again:
        async with grpc.aio.insecure_channel(again.address) as ch:
            p = (await pbg.PredictorServiceStub(ch).GetPrediction(pb.GetPredictionRequest(session_id="s1"))).prediction
            assert p.expected_duration_s == pytest.approx(4.0) and p.evidence == pb.EVIDENCE_DIRECT_TIMING
