"""Discrete-event cluster simulation: N engine-model replicas, tool workers, the predictor core,
the router core and the planner policy, in virtual time
(docs/simulation.md#discrete-event-cluster-simulator).

Everything that decides is the shipped code: ``services.sim.engine.Engine`` per replica; the router's
pure core (``services.router.core.RouterCore``: session table, footprints, cache evidence,
snapshots, plan revalidation and application, per-request routing); the predictor core
(``services.predictor.core.Predictor``) fed with the trace's tool events (started / progress /
finished with the runner's hints); the policy from the planner registry (docs/architecture.md#planner-core-api). The
simulator only moves time and plays the I/O around them:

- the agent harness: closed loop (at most ``concurrency`` sessions active), each request sent
  when the previous tool returns, the session released when its task ends;
- the tool runners: events at the trace's times; ``finished`` when the tool returns;
- the planner service (gating policies): snapshot (``build_snapshot`` with the predictor's
  readiness) on pool changes debounced by ``debounce_s`` and every ``tick_s``; the plan is
  applied ``plan_latency_s`` later through ``RouterCore.apply_plan`` then ``dispatch``;
- the router's /metrics scrape every ``tick_s`` (running / waiting / prefix hit rate);
- planner wall time is measured around ``Policy.plan`` and reported as a share of the
  simulated makespan; it never moves virtual time, so a run is deterministic;
- vLLM's length check: a request whose prompt + max_tokens exceeds the replica's
  ``max_model_len`` is answered with vLLM's 400 when the router forwards it
  (``services.sim.engine.length_violation``); the router finishes it without usage and the
  harness ends the session there, as the live driver does. Such a session is *failed*: it is
  not a completed task, so task latency (over completed sessions) leaves it out, in both worlds.

``pause_revalidation`` (default on) is the router core's (``CoreConfig.pause_revalidation``):
a plan's pause is dropped when pending releases already cover its replica's excess; the flag
lets the behaviour without it be measured.

Ties in virtual time are broken by insertion order; nothing iterates over a hash-ordered set.
"""

from __future__ import annotations

import heapq
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from services.planner.core.model import Plan, Snapshot
from services.planner.core.policy import Policy
from services.predictor.core import EventType, Predictor, PredictorConfig, ToolEvent
from services.predictor.core.config import ExplorationConfig
from services.router.core.model import NewRequest, PlanDecision, Replica, Usage
from services.router.core.plans import PAUSE_DROPPED
from services.router.core.snapshot import build_snapshot
from services.router.core.state import RouterCore, admission_hooks, core_config
from services.sim.cluster.kv_events import with_kv_events
from services.sim.cluster.metrics import RequestRecord, SessionOutcome
from services.sim.cluster.oracle import RemainingWork
from services.sim.cluster.state import SimSession
from services.sim.engine import (
    ChainCache,
    Engine,
    EngineRequest,
    Profile,
    StepResult,
    TokenContent,
    get_profile,
    length_violation,
)
from services.sim.workload.trace import TraceSession

_ARRIVE, _STEP_DONE, _PROGRESS, _TOOL_END, _PLAN, _APPLY, _TICK = range(7)

CHAINS = ChainCache(max_chains=1 << 16)
"""Block-hash chains shared by every run in this process (values are deterministic)."""


class SimulationError(RuntimeError):
    """The simulation cannot go on (e.g. a request larger than a replica's KV cache)."""


@dataclass(frozen=True, slots=True)
class SimConfig:
    replicas: int = 4
    profile: str = "qwen3-32b-h100x2"
    concurrency: int | None = None  # at most this many sessions active; None = unlimited
    seed: int = 0  # seeds the predictor's exploration grants
    utilisation_target: float = 0.95  # docs/algorithms.md#footprint
    tick_s: float = 1.0  # planner tick and /metrics scrape period
    debounce_s: float = 0.05
    plan_latency_s: float = 0.01
    num_gpu_blocks: int | None = None  # override the profile's KV cache size per replica
    max_num_seqs: int | None = None
    pause_revalidation: bool = True
    stall_timeout_s: float = 3600.0  # stop if nothing progresses this long (virtual)
    #: gating policies get the router's ``kv_events`` credit too (replicas publish KV events):
    #: every idle session's prompt blocks each replica holds (``services.sim.cluster.kv_events``)
    kv_events_credit: bool = False

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ValueError("replicas must be >= 1")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        if not 0 < self.utilisation_target <= 1:
            raise ValueError("utilisation_target must be in (0, 1]")
        if self.tick_s <= 0 or self.debounce_s < 0 or self.plan_latency_s < 0:
            raise ValueError("tick_s must be > 0, debounce_s and plan_latency_s >= 0")


class _TimedPolicy:
    """Wraps a policy so the router core's inline calls (per-request routing) are timed too.
    ``annotate`` (per-request policies: the replicas' KV events, see ``services.sim.cluster.kv_events``)
    completes each snapshot before the policy sees it; it is not timed as planner work."""

    def __init__(self, policy: Policy) -> None:
        self.inner = policy
        self.name = policy.name
        self.gates_admission = policy.gates_admission
        self.sticky = policy.sticky
        self.wall_s = 0.0
        self.calls = 0
        self.annotate: Callable[[Snapshot], Snapshot] | None = None

    def plan(self, snapshot: Snapshot) -> Plan:
        if self.annotate is not None:
            snapshot = self.annotate(snapshot)
        t0 = time.perf_counter()
        plan = self.inner.plan(snapshot)
        self.wall_s += time.perf_counter() - t0
        self.calls += 1
        return plan


@dataclass(slots=True)
class _Replica:
    id: str
    engine: Engine
    busy: bool = False
    prompt_seen: int = 0
    cached_seen: int = 0

    @property
    def hit_rate(self) -> float:
        return self.cached_seen / self.prompt_seen if self.prompt_seen else 0.0


@dataclass(slots=True)
class RunResult:
    policy: str
    requests: list[RequestRecord]
    sessions: list[SessionOutcome]
    preemptions: int
    planner_wall_s: float
    plans: int
    sim_end_s: float
    stalled: bool
    incomplete: list[str] = field(default_factory=list)
    #: sessions ended by vLLM's 400 (a request longer than ``max_model_len``), as the live driver ends them
    failed: list[str] = field(default_factory=list)
    counters: dict[str, int] = field(default_factory=dict)
    busy_s: float = 0.0  # seconds the replicas spent executing engine steps, summed


class ClusterSim:
    """One policy on one trace. ``run()`` once."""

    def __init__(self, sessions: Sequence[TraceSession], policy: Policy, config: SimConfig,
                 uses_ground_truth: bool = False, profile: Profile | None = None) -> None:
        """``profile`` overrides ``config.profile`` (a profile object not in the engine registry);
        ``uses_ground_truth`` (or the policy's attribute of that name) gives the planner perfect
        readiness from the trace instead of the predictor's (the oracle)."""
        self.cfg = config
        self.policy = _TimedPolicy(policy)
        self.gating = bool(policy.gates_admission)
        self.truth = uses_ground_truth or bool(getattr(policy, "uses_ground_truth", False))
        if profile is None:
            profile = get_profile(config.profile)
        self.core = RouterCore(
            core_config(policy, config.utilisation_target, pause_revalidation=config.pause_revalidation),
            None if self.gating else self.policy,
            **admission_hooks(policy),
        )
        self.replicas: list[_Replica] = []
        for k in range(config.replicas):
            eng = Engine(profile, num_gpu_blocks=config.num_gpu_blocks, max_num_seqs=config.max_num_seqs)
            self.replicas.append(_Replica(f"r{k}", eng))
        self.rep_by_id = {r.id: r for r in self.replicas}
        if not self.gating:  # a per-request router subscribes to the replicas' KV events
            engines = {r.id: r.engine for r in self.replicas}
            self.policy.annotate = lambda snap: with_kv_events(snap, self._held_prompt, engines)
        elif config.kv_events_credit:
            engines = {r.id: r.engine for r in self.replicas}
            self.policy.annotate = lambda snap: with_kv_events(snap, self._pool_prompt, engines, only_held=False)
        self._scrape(0.0)
        self.predictor = Predictor(PredictorConfig(exploration=ExplorationConfig(seed=config.seed)))
        self.horizon_s = self.predictor.cfg.horizon_s
        order = sorted(range(len(sessions)), key=lambda i: (sessions[i].arrival_s, i))
        self.sessions = [SimSession(sessions[i], rank) for rank, i in enumerate(order)]
        self.by_id = {s.id: s for s in self.sessions}
        if getattr(policy, "uses_remaining_work", False):  # the oracle-remaining reference
            policy.remaining_work = self._remaining_work  # type: ignore[attr-defined]
        self.by_request: dict[str, SimSession] = {}
        self.active: dict[str, SimSession] = {}
        self.pending: deque[SimSession] = deque()
        self.heap: list[tuple[float, int, int, object]] = []
        self._seq = 0
        self.now = 0.0
        self._plan_at: float | None = None
        self._last_progress_s = 0.0
        self.records: list[RequestRecord] = []
        self.done: list[SessionOutcome] = []
        self.failed: list[str] = []  # sessions ended by vLLM's 400 (length)
        self.plans = 0
        self.counters: dict[str, int] = {
            "admitted": 0, "admitted_moved": 0, "rejected": 0, "paused_acting": 0, "pause_deferred": 0,
            "pauses_dropped": 0, "plans_applied": 0,
        }

    def _remaining_work(self, session_id: str) -> RemainingWork | None:
        """What is left of a live session, from the trace (``oracle-remaining`` only): ``turn`` is
        the request next or in flight, and while a tool runs the one after it."""
        s = self.by_id.get(session_id)
        if s is None or s.phase in ("PENDING", "ENDED"):
            return None
        tool_left = max(0.0, s.tool_end_s - self.now) if s.phase == "ACTING" else 0.0
        turns = tuple((t.append_tokens, t.output_tokens, t.tool.duration_s if t.tool else 0.0)
                      for t in s.trace.turns[s.turn:])
        return RemainingWork(s.context_tokens, tool_left, turns)

    # ------------------------------------------------------------------ events
    def _push(self, t: float, kind: int, payload: object) -> None:
        self._seq += 1
        heapq.heappush(self.heap, (t, self._seq, kind, payload))

    def run(self) -> RunResult:
        for s in self.sessions:
            self._push(s.trace.arrival_s, _ARRIVE, s)
        self._push(0.0, _TICK, None)
        stalled = False
        total = len(self.sessions)
        while self.heap and len(self.done) + len(self.failed) < total:
            t, _, kind, payload = heapq.heappop(self.heap)
            self.now = t
            if kind == _STEP_DONE:
                self._on_step_done(*payload)  # type: ignore[misc]
            elif kind == _TOOL_END:
                self._on_tool_end(payload)  # type: ignore[arg-type]
            elif kind == _PROGRESS:
                self.predictor.observe(payload)  # type: ignore[arg-type]
            elif kind == _ARRIVE:
                self.pending.append(payload)  # type: ignore[arg-type]
                self._fill_slots()
            elif kind == _PLAN:
                self._plan_at = None
                self._plan_and_apply_later()
            elif kind == _APPLY:
                self._apply(*payload)  # type: ignore[misc]
            elif kind == _TICK:
                if self.now - self._last_progress_s > self.cfg.stall_timeout_s:
                    stalled = True
                    break
                self._scrape(self.now)
                if self.gating:
                    self._plan_and_apply_later()
                self._push(self.now + self.cfg.tick_s, _TICK, None)
        incomplete = [s.id for s in self.sessions if s.phase != "ENDED"]
        return RunResult(
            policy=self.policy.name, requests=self.records, sessions=self.done,
            preemptions=sum(r.engine.num_preemptions_total for r in self.replicas),
            planner_wall_s=self.policy.wall_s, plans=self.policy.calls, sim_end_s=self.now,
            stalled=stalled or bool(incomplete), incomplete=incomplete, counters=dict(self.counters),
            busy_s=sum(r.engine.busy_time_s for r in self.replicas), failed=list(self.failed),
        )

    def _scrape(self, now: float) -> None:
        """The router's /metrics scrape: capacity, running/waiting, prefix hit rate."""
        for r in self.replicas:
            eng = r.engine
            self.core.upsert_replica(Replica(
                id=r.id, url=f"sim://{r.id}", kv_capacity_tokens=eng.num_gpu_blocks * eng.block_size,
                healthy=True, running=eng.num_running, waiting=eng.num_waiting,
                kv_cache_usage=eng.kv_cache_usage, prefix_hit_rate=min(1.0, r.hit_rate),
                reports_cached_tokens=True, block_size=eng.block_size,
            ), now)

    # --------------------------------------------------------------- sessions
    def _fill_slots(self) -> None:
        limit = self.cfg.concurrency
        while self.pending and (limit is None or len(self.active) < limit):
            s = self.pending.popleft()
            s.content = CHAINS.synthetic(s.id, s.trace.shared_prefix_id, s.trace.system_prompt_tokens)
            s.start_s = self.now
            self.active[s.id] = s
            self._request_ready(s)

    def _held_prompt(self, session_id: str) -> tuple[TokenContent, int] | None:
        s = self.by_id.get(session_id)
        if s is None or s.phase != "WAITING" or s.content is None:
            return None
        return s.content, s.prompt_tokens_of(s.turn)

    def _pool_prompt(self, session_id: str) -> tuple[TokenContent, int] | None:
        """What the live router knows of an idle session's prompt: the held one, else the last one."""
        s = self.by_id.get(session_id)
        if s is None or s.content is None:
            return None
        if s.phase == "WAITING":
            return s.content, s.prompt_tokens_of(s.turn)
        return (s.content, s.last_prompt_tokens) if s.last_prompt_tokens > 0 else None

    def _admitted(self, s: SimSession) -> bool:
        cs = self.core.sessions.get(s.id)
        return cs is not None and cs.admitted

    def _request_ready(self, s: SimSession) -> None:
        s.ready_s = self.now
        s.paused_wait = self.gating and s.turn > 0 and not self._admitted(s)
        s.phase = "WAITING"
        prompt = s.prompt_tokens_of(s.turn)
        # Agent harnesses do not send a tight max_tokens, so the router does not learn the output length.
        # What the live gateway reads off the request (services/router/validation.py): sessions
        # with one system prompt share it, and its tokens.
        shared = s.trace.shared_prefix_id
        grant = self.core.arrive(self.now, NewRequest(
            f"{s.id}/{s.turn}", s.id, s.trace.tenant, False, prompt, None,
            prefix_key=shared or "", prefix_tokens=s.trace.system_prompt_tokens if shared else 0))
        if grant is not None:
            self._forward(s, grant.replica)
        elif self.gating:
            self._trigger_plan()

    def _forward(self, s: SimSession, replica: str) -> None:
        rep = self.rep_by_id[replica]
        turn = s.trace.turns[s.turn]
        prompt = s.prompt_tokens_of(s.turn)
        assert s.content is not None
        rid = f"{s.id}/{s.turn}"
        if length_violation(prompt, turn.output_tokens, rep.engine.max_model_len) is not None:
            # vLLM's 400 at once: the router finishes the request without usage, and the harness
            # gives the task up (the live driver ends a session at its first failed request).
            self.core.finish(self.now, rid, None)
            self._end_session(s, failed=True)
            return
        rep.engine.add_request(EngineRequest(rid, s.content, prompt, turn.output_tokens))
        self.by_request[rid] = s
        if s.replica is not None and s.replica != replica:
            self.counters["admitted_moved"] += 1
        s.replica = replica
        s.phase = "RUNNING"
        s.after_pause_flag = s.paused_since_request
        s.paused_since_request = False
        s.forwarded_s = self.now
        s.first_token_s = -1.0
        self._last_progress_s = self.now
        self._kick(rep)

    def _on_tool_end(self, s: SimSession) -> None:
        prev = s.turn - 1
        tool = s.trace.turns[prev].tool
        assert tool is not None
        self.predictor.observe(ToolEvent(self.now, s.id, f"{s.id}:{prev}", EventType.FINISHED, tool.name,
                                         tool.command, tool.deadline_s))
        self._request_ready(s)

    def _request_done(self, s: SimSession, rep: _Replica, prompt: int, cached: int, output: int) -> None:
        rid = f"{s.id}/{s.turn}"
        self.records.append(RequestRecord(
            s.id, s.turn, s.ready_s, s.forwarded_s, s.first_token_s, self.now, prompt, cached, output,
            rep.id, s.paused_wait, s.after_pause_flag,
        ))
        rep.prompt_seen += prompt
        rep.cached_seen += cached
        s.last_prompt_tokens = prompt
        s.last_output_tokens = output
        was_pending = self.core.sessions[s.id].pause_pending
        # vLLM omits prompt_tokens_details when nothing was cached (as the emulator does).
        self.core.finish(self.now, rid, Usage(prompt, output, cached if cached > 0 else None))
        if was_pending:
            s.paused_since_request = True
        self._last_progress_s = self.now
        turn = s.trace.turns[s.turn]
        if turn.tool is None:
            self._end_session(s)
            return
        tool = turn.tool
        call_id = f"{s.id}:{s.turn}"
        s.turn += 1
        s.phase = "ACTING"
        if self.truth:  # the oracle's footprint: the exact size of the next request
            nxt = s.trace.turns[s.turn]
            self.core.reveal_next_request(s.id, nxt.append_tokens, nxt.output_tokens)
        s.tool_end_s = self.now + tool.duration_s
        self.predictor.observe(ToolEvent(self.now, s.id, call_id, EventType.STARTED, tool.name, tool.command,
                                         tool.deadline_s))
        for ev in tool.progress or ():
            self._push(self.now + ev.after_s, _PROGRESS, ToolEvent(
                self.now + ev.after_s, s.id, call_id, EventType.PROGRESS, tool.name, tool.command,
                tool.deadline_s, ev.eta_s, ev.fraction))
        self._push(s.tool_end_s, _TOOL_END, s)
        if self.gating and was_pending:
            self._trigger_plan()  # the session joined the pool

    def _end_session(self, s: SimSession, failed: bool = False) -> None:
        s.phase = "ENDED"
        self._last_progress_s = self.now  # a session ending, by vLLM's 400 too, is progress
        self.core.release(self.now, s.id)  # the harness ends the task's session
        del self.active[s.id]
        if failed:
            self.failed.append(s.id)
        else:
            self.done.append(SessionOutcome(s.id, s.start_s, self.now))
        self._fill_slots()
        if self.gating:
            self._trigger_plan()

    # ---------------------------------------------------------------- engines
    def _kick(self, rep: _Replica) -> None:
        if rep.busy:
            return
        eng = rep.engine
        for _ in range(1000):
            if not eng.has_work():
                return
            res = eng.step()
            if res.num_seqs:
                rep.busy = True
                self._push(self.now + res.duration_s, _STEP_DONE, (rep, res))
                return
        raise SimulationError(f"replica {rep.id}: engine makes no progress")

    def _on_step_done(self, rep: _Replica, res: StepResult) -> None:
        rep.busy = False
        now = self.now
        for rid in res.first_token:
            s = self.by_request[rid]
            s.first_token_s = now
            self.core.first_token(rid, now - s.ready_s)
        for f in res.finished:
            s = self.by_request.pop(f.request_id)
            self._request_done(s, rep, f.prompt_tokens, f.cached_tokens, f.output_tokens)
        self._kick(rep)

    # ---------------------------------------------------------------- planning
    def _trigger_plan(self) -> None:
        if self._plan_at is None:
            self._plan_at = self.now + self.cfg.debounce_s
            self._push(self._plan_at, _PLAN, None)

    def snapshot(self) -> Snapshot:
        """What the planner sees now: the router core's snapshot with readiness from the
        predictor (or, for the oracle, from the trace's true tool end times)."""
        readiness: dict[str, bool] = {}
        returns: dict[str, float] = {}
        for s in self.active.values():
            if s.phase == "ACTING":
                if self.truth:
                    readiness[s.id] = s.tool_end_s - self.now <= self.horizon_s
                    returns[s.id] = s.tool_end_s
                else:
                    pred = self.predictor.predict(s.id, self.now)
                    readiness[s.id] = pred.ready
                    if pred.remaining_s is not None:
                        returns[s.id] = self.now + pred.remaining_s
        return build_snapshot(self.core, self.now, readiness, returns=returns)

    def _plan_and_apply_later(self) -> None:
        if not self.active:
            return
        snap = self.snapshot()
        plan = self.policy.plan(snap)
        if self.cfg.plan_latency_s > 0:
            self._push(self.now + self.cfg.plan_latency_s, _APPLY, (plan, snap.now_s))
        else:
            self._apply(plan, snap.now_s)

    def _apply(self, plan: Plan, snapshot_at_s: float) -> None:
        c = self.counters
        c["plans_applied"] += 1
        report = self.core.apply_plan(self.now, PlanDecision(
            tuple((a.session, a.replica) for a in plan.assignments), tuple(plan.pauses), snapshot_at_s, plan.policy))
        c["admitted"] += len(report.admitted)
        dropped = sum(1 for _, why in report.rejected if why in PAUSE_DROPPED)  # counted apart
        c["pauses_dropped"] += dropped
        c["rejected"] += len(report.rejected) - dropped
        c["paused_acting"] += len(report.paused)
        c["pause_deferred"] += len(report.pause_deferred)
        for sid in report.paused:
            self.by_id[sid].paused_since_request = True
        for g in self.core.dispatch(self.now):
            self._forward(self.by_id[g.session_id], g.replica)

