"""Drives the pure engine in scaled wall-clock time and fans its outputs out to HTTP streams.

Time: ``time_scale = X`` means model time runs X times faster than wall time, so a step the
model says takes ``d`` seconds occupies ``d / X`` seconds of wall time. The loop sleeps until the
step's scaled end before publishing its tokens. If Python cannot keep up (a step's bookkeeping
takes longer than ``d / X``), model time falls behind scaled wall time; ``lag_s`` reports by how
much (model seconds), and the loop stops sleeping until it has caught up, handing tokens to the
HTTP streams in batches (several tokens per SSE chunk; see ``_run``). When the engine is idle,
model time jumps to the current scaled wall time, so idle gaps cost nothing.

All latencies reported (usage, metrics) are model seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

from services.sim.engine import Engine, EngineRequest, FinishedRequest, StepResult
from services.sim.vllm_sim.kv_publisher import KVEventPublisher
from services.sim.vllm_sim.metrics import SimMetrics

PUBLISH_INTERVAL_S = 0.002  # wall seconds between hand-offs to HTTP streams while behind the model


@dataclass(slots=True)
class Stream:
    """Output of one request as the runner publishes it."""

    request_id: str
    pieces: list[str]
    prompt_tokens: int
    arrival_model_s: float
    emitted: int = 0
    cached_tokens: int = 0
    finished: FinishedRequest | None = None
    first_token_model_s: float | None = None
    last_token_model_s: float | None = None
    changed: asyncio.Event = field(default_factory=asyncio.Event)


class EngineRunner:
    def __init__(self, engine: Engine, metrics: SimMetrics | None, time_scale: float) -> None:
        if time_scale <= 0:
            raise ValueError(f"time_scale must be > 0, got {time_scale}")
        self.engine = engine
        self.metrics = metrics
        self.time_scale = time_scale
        self._streams: dict[str, Stream] = {}
        self._wake = asyncio.Event()
        self._t0 = 0.0
        self._model_now = 0.0
        self._step_end = 0.0
        self._busy = False
        self._lag_s = 0.0
        self.max_lag_s = 0.0
        self.steps = 0
        self._task: asyncio.Task[None] | None = None
        #: publishes the engine's KV events, one batch per step (vLLM's publisher)
        self.kv_publisher: KVEventPublisher | None = None

    # ------------------------------------------------------------------ clock
    def _wall_model(self) -> float:
        return (asyncio.get_running_loop().time() - self._t0) * self.time_scale

    def model_now(self) -> float:
        """Model time a request arriving now is stamped with."""
        wall = self._wall_model()
        return min(wall, self._step_end) if self._busy else max(wall, self._model_now)

    @property
    def lag_s(self) -> float:
        return self._lag_s

    def clock_report(self) -> tuple[float, float, float]:
        """(model time now, current lag, max lag), all model seconds."""
        if self._busy:
            behind = self._wall_model() - self._step_end  # the running step should end at _step_end
            lag = max(behind, self._lag_s, 0.0)
            return self._model_now, lag, max(lag, self.max_lag_s)
        return max(self._model_now, self._wall_model()), 0.0, self.max_lag_s

    # -------------------------------------------------------------- requests
    def submit(self, request: EngineRequest, pieces: list[str]) -> Stream:
        """Queue a request; raises ValueError (engine validation) before anything is queued."""
        stream = Stream(request.request_id, pieces, request.prompt_tokens, self.model_now())
        self.engine.add_request(request)
        self._streams[request.request_id] = stream
        self._wake.set()
        return stream

    def abort(self, request_id: str) -> None:
        stream = self._streams.pop(request_id, None)
        fin = self.engine.abort(request_id)
        if fin is not None and self.metrics is not None:
            self.metrics.success["abort"].inc()
        if stream is not None and fin is not None:
            stream.finished = fin
            stream.changed.set()

    @property
    def num_streams(self) -> int:
        return len(self._streams)

    # ------------------------------------------------------------------ loop
    def start(self) -> None:
        self._t0 = asyncio.get_running_loop().time()
        self._task = asyncio.create_task(self._run(), name="vllm-sim-engine")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        engine = self.engine
        pending: list[tuple[StepResult, float]] = []
        last_publish = loop.time()
        handler_s = 0.0  # wall time the HTTP side needed after the previous hand-off
        while True:
            if not engine.has_work():
                self._flush(pending)
                self._busy = False
                self._lag_s = 0.0
                self._wake.clear()
                await self._wake.wait()
                self._model_now = max(self._model_now, self._wall_model())
                last_publish = loop.time()
                continue
            self._busy = True
            result = engine.step()
            self.steps += 1
            if self.kv_publisher is not None:
                self.kv_publisher.publish(engine.take_kv_events())
            end = self._model_now + result.duration_s
            self._step_end = end
            pending.append((result, end))
            delay = self._t0 + end / self.time_scale - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
                self._model_now = end
                self._lag_s = 0.0
                self._flush(pending)
                last_publish = loop.time()
                continue
            # Behind the model: step on without sleeping and hand tokens to the HTTP side only
            # after stepping for at least as long as the HTTP side needed last time (and at least
            # PUBLISH_INTERVAL_S), so each SSE chunk carries several tokens under load (as vLLM's
            # output collector merges outputs for a slow consumer) instead of the loop spending
            # all its time on one-token writes.
            self._model_now = end
            lag = self._wall_model() - end
            self._lag_s = lag if lag > 0 else 0.0
            if self._lag_s > self.max_lag_s:
                self.max_lag_s = self._lag_s
            now = loop.time()
            if now - last_publish >= max(PUBLISH_INTERVAL_S, handler_s):
                self._flush(pending)
                await asyncio.sleep(0)
                last_publish = loop.time()
                handler_s = last_publish - now

    def _flush(self, pending: list[tuple[StepResult, float]]) -> None:
        for result, end in pending:
            self._publish(result, end)
        pending.clear()

    def _publish(self, result: StepResult, now: float) -> None:
        streams = self._streams
        m = self.metrics
        for rid, n in result.new_tokens.items():
            s = streams.get(rid)
            if s is None:
                continue
            s.emitted += n
            if s.first_token_model_s is None:
                s.first_token_model_s = now
                if m is not None:
                    m.ttft.observe(max(0.0, now - s.arrival_model_s))
                    m.prompt_tokens.inc(s.prompt_tokens)
            elif m is not None and s.last_token_model_s is not None:
                m.itl.observe(now - s.last_token_model_s)
            s.last_token_model_s = now
            s.changed.set()
        for fin in result.finished:
            s = streams.pop(fin.request_id, None)
            if s is None:
                continue
            s.finished = fin
            s.cached_tokens = fin.cached_tokens
            if m is not None:
                m.success[fin.finish_reason].inc()
                m.e2e.observe(max(0.0, now - s.arrival_model_s))
            s.changed.set()
