"""Continuum (arXiv 2511.02230): program-level FCFS plus a KV-cache time-to-live per tool call.

Sources (read for this port):
- Paper: H. Li et al., "Continuum: Efficient and Robust Multi-Turn LLM Agent Scheduling with KV
  Cache Time-to-Live", arXiv 2511.02230 (v6): Algorithm 1 (§4); §4.1 utility model; §4.2
  setting the TTL (empirical CDF, cold start, K = 100, T initialised to 0); §4.3 scheduling
  priority; §5.2 pinning, unpinning and deadlock prevention, offline prefill profile.
- Code: github.com/Hanchenli/vllm-continuum at 3761e57 (read through its fork
  Whrlicht/vllm-continuum, which keeps the upstream history): ``vllm/v1/core/sched/scheduler.py``
  (``pin_request``, ``unpin_requests_regular``, ``_free_blocks``,
  ``pop_running_request_based_on_last_step``), ``vllm/v1/core/sched/request_queue.py``
  (``ContinuumRequestQueue``: pinned programs first, then job-level FCFS by first entry time),
  ``vllm/v1/core/estimate_with_func.py`` (``ToolCallEstimator.set_up_pin``: the preview pins for
  ``FIXED_THRESHOLD_CONTINUUM`` = 2.0 s when the tool's mean duration is at most 2 s, else not at
  all). The author says in Hanchenli/vllm-continuum issue #19 that the repository is a simplified
  version of the paper's algorithm (mean instead of the empirical CDF); we follow the paper.

The published design:
- When a request that called a tool finishes, its KV stays pinned for
  ``τ* = argmax_τ P(τ, f)·(T·η + PrefillReload(r)) − τ`` (§4.2, the MemUsage/M factors of
  Cost = MemUsage/M·τ and Benefit = MemUsage/M·PrefillReload + T/M·MemUsage·η cancel), where
  P(τ, f) is the empirical CDF of tool f's past durations, T the sliding-window mean queueing
  delay of evicted requests (initialised to 0), η = −Corr(k, N − k) the memoryfulness of the
  workload (k requests served of N in a program), PrefillReload a quadratic fit of prefill time
  against context length (§5.2). Candidates are the recorded durations and 0. Cold start: while
  |S| <= K (100) a fixed T_default (derived from Exp(1) tool durations and η = 1; 2.0 s in the
  code); while |S[f]| <= K the global CDF.
- A pin is released when its TTL has passed and the program has no request waiting (§5.2
  ``unpin_requests``), when the program's next request is scheduled (Algorithm 1), or when the
  program ends.
- Waiting requests are ordered: preempted first, then those of pinned programs, then program-level
  FCFS (the program's first arrival); the head is scheduled while it fits, else the loop stops
  (Algorithm 1 ``Break``) — strict head-of-line FCFS.
- Deadlock prevention (§5.2): when the head cannot be scheduled for lack of space, pinned requests
  are unpinned, latest program arrival first, until it fits.

Mapping onto our snapshot (program = session; pin = an admitted ACTING session; unpin = pause):
- The waiting queue is the pool's WAITING sessions. A pinned program's next request is already
  admitted (the router forwards it), so the "TTL status" key is implicit; "preempted" is empty
  (the planner never cuts a running request; vLLM preempts inside the engine as in the paper).
  Pool ACTING/PAUSED sessions have no request, so Continuum does not admit them.
- Program arrival: the first time this instance sees the session (its ``waiting_since_s`` /
  ``acting_since_s`` when known, else ``now_s``), kept until the session ends.
- The TTL is computed once per tool call, when a session is first seen admitted in ACTING with a
  new ``acting_since_s``; the pin expires at ``acting_since_s + τ*``. τ* = 0 pauses at once
  (end-of-turn eviction). Pins on an over-capacity replica are released latest arrival first
  (the deadlock rule applied to the engine's own contention); RUNNING sessions are left to vLLM.
- P(τ, f) without tool names (deviation): the snapshot's predictor gives d = ``tool_return_s``
  − ``acting_since_s``. With more than K recorded (actual / predicted) ratios ρ the empirical CDF
  of {d·ρ} is used (the paper's fine-grained S[f]); before that, Exp(mean d) — the paper's own
  cold-start assumption (Exp(1)) scaled to the prediction — whose argmax is closed-form:
  τ* = d·ln(B/d) when B > d, else 0. Without a prediction: the global CDF of observed durations
  once |S| > K, else T_default = 2.0 s. Durations are observed from ``acting_since_s`` to the
  moment the session leaves ACTING (its ``waiting_since_s``, else ``now_s``).
- PrefillReload: c0 + c1·n + c2·n² seconds for n = ``context_tokens`` (``footprint_tokens``
  when 0). Defaults c1 = 5.10e-5 s/token, c2 = 1.18e-9 s/token², c0 = 0: the paper's §5.2
  recipe (prefill for 1k, 2k, 4k, … tokens, quadratic fit) applied to this repository's
  qwen3-32b-h100x2 engine model (services/sim/engine/step_time.py, 8192-token chunks, 1k–128k tokens);
  about 19.6k tokens/s for short contexts.
- T: mean of the last ``queue_window`` (100; the paper gives no size) pool waits of sessions this
  policy had unpinned, measured when it admits them again. η from the turns seen per session
  (tool calls + 1) when it ends; 1.0 (fully memoryful) until the correlation is defined.
- Placement (not in the paper: one engine): the session's last replica (``last_replica``: its
  newest usage observation; until 2026-12-04 only an admitted session's, so a paused one never
  went home on purpose) when it fits, else the
  healthy replica with the most room; the deadlock rule picks the replica needing the fewest
  unpins. Tenant headroom skips a tenant's sessions once its slots are used (not a memory stop).
  Only replicas serving the session's model are considered, and head-of-line blocking is per
  model (a blocked head of one model's queue does not hold back another model's sessions; an
  unnamed model, ``""``, blocks every queue, as with one engine).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections import deque
from dataclasses import dataclass

from services.common.core.evidence import last_used_replica
from services.planner.core.model import Assignment, Plan, SessionState, Snapshot
from services.planner.core.policy import (
    PlanCounter,
    Stopwatch,
    elapsed_ms,
    full_objective,
    pool_candidates,
    sorted_replicas,
    start_time,
)


@dataclass(frozen=True, slots=True)
class ContinuumConfig:
    default_ttl_s: float = 2.0  # T_default, FIXED_THRESHOLD_CONTINUUM (estimate_with_func.py)
    history_threshold: int = 100  # K (§4.2)
    queue_window: int = 100  # sliding window of T (size not published)
    initial_queue_delay_s: float = 0.0  # "initialize T as zero" (§4.2)
    default_eta: float = 1.0  # fully memoryful until measured
    prefill_constant_s: float = 0.0
    prefill_linear_s: float = 5.10e-5  # s per token, qwen3-32b-h100x2 fit (module docstring)
    prefill_quadratic_s: float = 1.18e-9  # s per token²
    max_history: int = 4096  # bound on recorded durations / ratios
    #: one Continuum engine per replica behind a session-sticky router (``continuum-affine``):
    #: each program keeps its replica (its last one; a new program goes to the replica with the
    #: most room), the FCFS queue and its head-of-line blocking are per replica, and the
    #: deadlock rule unpins only there. False: one fleet-wide queue (module docstring).
    per_replica_queues: bool = False


def prefill_reload_s(tokens: int, cfg: ContinuumConfig) -> float:
    """PrefillReload(r): the quadratic prefill-time fit of §5.2, in seconds."""
    n = max(0, tokens)
    return max(0.0, cfg.prefill_constant_s + cfg.prefill_linear_s * n + cfg.prefill_quadratic_s * n * n)


def ttl_empirical(samples: list[float], benefit_s: float) -> float:
    """τ* = argmax over {0} ∪ samples of P(τ)·B − τ, P the empirical CDF (§4.2); ties keep the smaller τ."""
    if not samples:
        return 0.0
    ordered = sorted(max(0.0, t) for t in samples)
    n = len(ordered)
    best_tau, best_u = 0.0, bisect_right(ordered, 0.0) / n * benefit_s
    for tau in sorted(set(ordered)):
        u = bisect_right(ordered, tau) / n * benefit_s - tau
        if u > best_u:
            best_tau, best_u = tau, u
    return best_tau


def ttl_exponential(mean_s: float, benefit_s: float) -> float:
    """τ* for Exp(mean) tool durations: argmax (1 − e^(−τ/d))·B − τ = d·ln(B/d) when B > d, else 0.

    The paper derives T_default from Exp(1) (§4.2 cold start); here the mean is the prediction.
    """
    if mean_s <= 0.0:
        return 0.0
    if benefit_s <= mean_s:
        return 0.0
    return mean_s * math.log(benefit_s / mean_s)


class _Memoryfulness:
    """η = −Corr(k, N − k) over the (served, remaining) pairs of ended programs (§4.1)."""

    def __init__(self) -> None:
        self.n = 0
        self.sx = self.sy = self.sxx = self.syy = self.sxy = 0.0

    def observe(self, turns: int) -> None:
        for k in range(1, turns + 1):
            x, y = float(k), float(turns - k)
            self.n += 1
            self.sx += x
            self.sy += y
            self.sxx += x * x
            self.syy += y * y
            self.sxy += x * y

    def value(self, default: float) -> float:
        if self.n < 2:
            return default
        cov = self.n * self.sxy - self.sx * self.sy
        var = (self.n * self.sxx - self.sx**2) * (self.n * self.syy - self.sy**2)
        if var <= 0.0:
            return default
        return min(1.0, max(-1.0, -cov / math.sqrt(var)))


@dataclass(frozen=True, slots=True)
class _Pin:
    acting_since_s: float
    ttl_s: float
    expires_s: float


class ContinuumPolicy:
    gates_admission = True
    sticky = True

    def __init__(self, name: str = "continuum", config: ContinuumConfig | None = None,
                 stopwatch: Stopwatch | None = None) -> None:
        self.name = name
        self.config = config or ContinuumConfig()
        self._stopwatch = stopwatch
        self._revisions = PlanCounter()
        self._arrival: dict[str, float] = {}  # program-level FCFS key
        # The router core reads this (CoreConfig.fast_admit): Continuum's queue runs inside vLLM's
        # scheduler, which admits a request at its next step when no other program waits and it
        # fits, not at a planner's tick.
        self.fast_admit = "home-only" if self.config.per_replica_queues else "home"
        self._pins: dict[str, _Pin] = {}
        self._open_tool: dict[str, tuple[float, float | None]] = {}  # id -> (start, predicted duration)
        self._turns: dict[str, int] = {}
        self._evicted: set[str] = set()  # unpinned by us; their next pool wait feeds T
        self._durations: deque[float] = deque(maxlen=self.config.max_history)  # S (global)
        self._ratios: deque[float] = deque(maxlen=self.config.max_history)  # actual / predicted
        self._queue_delays: deque[float] = deque(maxlen=self.config.queue_window)
        self._eta = _Memoryfulness()

    # ------------------------------------------------------------------ model state
    @property
    def queue_delay_s(self) -> float:
        """T: sliding-window mean queueing delay of evicted requests."""
        if not self._queue_delays:
            return self.config.initial_queue_delay_s
        return sum(self._queue_delays) / len(self._queue_delays)

    @property
    def eta(self) -> float:
        return self._eta.value(self.config.default_eta)

    def benefit_s(self, s: SessionState) -> float:
        """Benefit / (MemUsage/M) = T·η + PrefillReload(r), in seconds (§4.2)."""
        tokens = s.context_tokens or s.footprint_tokens
        return self.queue_delay_s * self.eta + prefill_reload_s(tokens, self.config)

    def ttl_s(self, s: SessionState, start_s: float) -> float:
        """CalcTTL (Algorithm 1) for the tool call ``s`` started at ``start_s``."""
        cfg = self.config
        benefit = self.benefit_s(s)
        if s.tool_return_s is not None:
            predicted = max(0.0, s.tool_return_s - start_s)
            if len(self._ratios) > cfg.history_threshold:
                return ttl_empirical([predicted * r for r in self._ratios], benefit)
            return ttl_exponential(predicted, benefit)
        if len(self._durations) > cfg.history_threshold:
            return ttl_empirical(list(self._durations), benefit)
        return cfg.default_ttl_s

    def pin_of(self, session_id: str) -> tuple[float, float] | None:
        """(ttl_s, expires_s) of the session's current tool call, for diagnostics and tests."""
        p = self._pins.get(session_id)
        return None if p is None else (p.ttl_s, p.expires_s)

    # ------------------------------------------------------------------ plan
    def plan(self, snapshot: Snapshot) -> Plan:
        start = start_time(self._stopwatch)
        now = snapshot.now_s
        sessions = sorted(snapshot.sessions, key=lambda s: s.id)
        self._observe(now, sessions)
        replicas = sorted_replicas(snapshot)
        healthy = {r.id: r for r in replicas if r.healthy}

        # Pins: a TTL per new tool call of an admitted session; expiry pauses (§5.2).
        pauses: list[str] = []
        pinned: dict[str, list[SessionState]] = {}
        for s in sessions:
            if not s.admitted or s.phase != "ACTING":
                self._pins.pop(s.id, None)  # released, or the next request came: the pin is used up
                continue
            begun = s.acting_since_s if s.acting_since_s is not None else now
            pin = self._pins.get(s.id)
            if pin is None or pin.acting_since_s != begun:
                ttl = self.ttl_s(s, begun)
                pin = _Pin(begun, ttl, begun + ttl)
                self._pins[s.id] = pin
            if pin.ttl_s <= 0.0 or now >= pin.expires_s:
                pauses.append(s.id)
            else:
                pinned.setdefault(s.replica or "", []).append(s)

        freed: dict[str, int] = {}
        for s in sessions:
            if s.id in pauses and s.replica is not None:
                freed[s.replica] = freed.get(s.replica, 0) + s.footprint_tokens
        room = {rid: r.capacity_tokens - r.used_tokens + freed.get(rid, 0) for rid, r in healthy.items()}
        for rid in pinned:  # deadlock victims: latest program arrival first
            pinned[rid].sort(key=lambda s: (self._arrival[s.id], s.id), reverse=True)

        def unpin(rid: str, count: int) -> None:
            for _ in range(count):
                v = pinned[rid].pop(0)
                pauses.append(v.id)
                room[rid] += v.footprint_tokens

        # An over-capacity replica releases pins until it fits again.
        for rid in sorted(room):
            while room[rid] < 0 and pinned.get(rid):
                unpin(rid, 1)

        # Program-level FCFS over the waiting queue with head-of-line blocking (Algorithm 1).
        headroom = dict(snapshot.tenant_headroom) if snapshot.tenant_headroom else {}
        queue = sorted((s for s in pool_candidates(snapshot) if s.phase == "WAITING"),
                       key=lambda s: (self._arrival[s.id], s.id))
        assigned: dict[str, str] = {}
        blocked: set[str] = set()  # models whose queue head does not fit
        blocked_replicas: set[str] = set()  # per_replica_queues: engines whose queue head does not fit
        for s in queue:
            if s.tenant in headroom and headroom[s.tenant] <= 0:
                continue
            if s.model in blocked or "" in blocked:
                continue
            need = s.footprint_tokens
            serving = {rid: free for rid, free in room.items() if healthy[rid].serves(s)}
            if need > max((healthy[rid].capacity_tokens for rid in serving), default=0):
                continue  # can never fit (vLLM rejects it at arrival); it must not block the queue
            home = last_replica(s)
            if self.config.per_replica_queues:
                # the engine a sticky router sends it to: home, else (a new program, or its replica
                # gone or too small) the one with the most room
                target = _home_or_roomiest(home, [r for r in serving if healthy[r].capacity_tokens >= need], room)
                if target is None or target in blocked_replicas:
                    continue
                victims = self._victims_needed(need, room[target], pinned.get(target, []))
                if victims < 0:
                    blocked_replicas.add(target)  # its engine's head waits; the others go on
                    continue
            else:
                target = _home_or_roomiest(home, [r for r, free in serving.items() if free >= need], room)
                victims = 0
                if target is None:
                    target = self._place_unpinning(need, serving, pinned, home)
                    if target is None:
                        blocked.add(s.model)
                        continue
                    victims = self._victims_needed(need, room[target], pinned.get(target, []))
            unpin(target, victims)
            assigned[s.id] = target
            room[target] -= need
            if s.tenant in headroom:
                headroom[s.tenant] -= 1
            if s.id in self._evicted and s.waiting_since_s is not None:
                self._queue_delays.append(max(0.0, now - s.waiting_since_s))
            self._evicted.discard(s.id)

        # A released pin stays on record until the session leaves (a deferred pause repeats).
        self._evicted.update(pauses)
        assignments = tuple(Assignment(sid, rid) for sid, rid in sorted(assigned.items()))
        return Plan(
            revision=self._revisions.next(),
            assignments=assignments,
            pauses=tuple(pauses),
            objective=full_objective(snapshot, assignments),
            solver="continuum-fcfs-ttl",
            solve_ms=elapsed_ms(self._stopwatch, start),
            policy=self.name,
        )

    @staticmethod
    def _victims_needed(need: int, free: int, victims: list[SessionState]) -> int:
        count = 0
        while free < need and count < len(victims):
            free += victims[count].footprint_tokens
            count += 1
        return count if free >= need else -1

    def _place_unpinning(self, need: int, room: dict[str, int],
                         pinned: dict[str, list[SessionState]], home: str | None) -> str | None:
        """The replica needing the fewest unpins for ``need`` (the session's ``home`` on a tie)."""
        best: tuple[int, bool, str] | None = None
        for rid in sorted(room):
            count = self._victims_needed(need, room[rid], pinned.get(rid, []))
            if count >= 0 and (best is None or (count, rid != home, rid) < best):
                best = (count, rid != home, rid)
        return None if best is None else best[2]

    # ------------------------------------------------------------------ history
    def _observe(self, now: float, sessions: list[SessionState]) -> None:
        """Program arrivals, tool durations (S and prediction ratios), turn counts (η)."""
        seen: set[str] = set()
        for s in sessions:
            seen.add(s.id)
            if s.phase == "ENDED":
                self._forget(s.id, ended=True)
                continue
            if s.id not in self._arrival:
                known = [t for t in (s.waiting_since_s, s.acting_since_s) if t is not None]
                self._arrival[s.id] = min(known, default=now)
            open_tool = self._open_tool.get(s.id)
            if s.phase == "ACTING" and s.acting_since_s is not None:
                if open_tool is None or open_tool[0] != s.acting_since_s:
                    predicted = None if s.tool_return_s is None else s.tool_return_s - s.acting_since_s
                    self._open_tool[s.id] = (s.acting_since_s, predicted)
                    self._turns[s.id] = self._turns.get(s.id, 0) + 1
            elif s.phase in ("WAITING", "RUNNING") and open_tool is not None:
                began, predicted = self._open_tool.pop(s.id)
                back = s.waiting_since_s if s.waiting_since_s is not None and s.waiting_since_s >= began else now
                duration = max(0.0, back - began)
                self._durations.append(duration)
                if predicted is not None and predicted > 0.0:
                    self._ratios.append(duration / predicted)
        for sid in sorted(set(self._arrival) - seen):
            self._forget(sid, ended=True)

    def _forget(self, sid: str, ended: bool) -> None:
        if ended and sid in self._arrival:
            self._eta.observe(self._turns.get(sid, 0) + 1)
        self._arrival.pop(sid, None)
        self._pins.pop(sid, None)
        self._open_tool.pop(sid, None)
        self._turns.pop(sid, None)
        self._evicted.discard(sid)


def last_replica(s: SessionState) -> str | None:
    """The replica ``s``'s last request ran on: its replica while admitted, else its newest usage
    observation (a pool session's ``replica`` is cleared when it is paused; ``last_used_replica``)."""
    return s.replica if s.replica is not None else last_used_replica(s.credits)


def _home_or_roomiest(home: str | None, able: list[str], room: dict[str, int]) -> str | None:
    """``home`` when it is among ``able``, else the ``able`` replica with the most room (then id)."""
    if home in able:
        return home
    return min(able, key=lambda rid: (-room[rid], rid), default=None)
