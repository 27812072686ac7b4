"""Readiness r(s) ∈ {0, 1} of calls and sessions at a given time (docs/algorithms.md#readiness).

A running call is ready when its exposed deadline D_at is within the horizon
(``D_at - horizon <= now <= D_at + deadline_grace``) or its predicted return T̂ is
(``T̂ - horizon <= now <= T̂ + overdue_grace``). Past ``T̂ + overdue_grace`` it is *overdue*:
ready only inside an exploration window granted by ``Explorer``. A call whose latest
event is older than ``stale_after_s`` does not count (STALE, not ready). A session with
no running call and a completion within ``stale_after_s`` is ready (COMPLETED).
"""

from __future__ import annotations

import hashlib
import math
from collections import deque

from services.predictor.core.config import ExplorationConfig, PredictorConfig
from services.predictor.core.estimate import CallState, CommandInfo
from services.predictor.core.model import ReadyReason


class Explorer:
    """Deterministic, bounded exploration grants (see ``ExplorationConfig``).

    A decision for (session, window) is memoised, so asking again within a window gives
    the same answer; decisions depend only on the seed, the ids, the window and the grants
    already made (query order decides who gets the last global slots).
    """

    def __init__(self, config: ExplorationConfig) -> None:
        self.cfg = config
        self._decided: dict[str, tuple[int, bool]] = {}  # session -> (window, granted)
        self._grants: dict[str, deque[int]] = {}  # session -> windows granted
        self._window_grants: tuple[int, int] = (-1, 0)  # (window, grants in it)

    def window_of(self, now_s: float) -> int:
        return math.floor(now_s / self.cfg.window_s)

    def next_window_s(self, now_s: float) -> float:
        return (self.window_of(now_s) + 1) * self.cfg.window_s

    def chance(self, session_id: str, call_id: str, window: int) -> float:
        """Uniform [0, 1) from (seed, session, call, window)."""
        digest = hashlib.blake2b(
            f"{self.cfg.seed}\x1f{session_id}\x1f{call_id}\x1f{window}".encode(), digest_size=8
        ).digest()
        return int.from_bytes(digest, "big") / 2.0**64

    def granted(self, session_id: str, call_id: str, now_s: float) -> bool:
        cfg = self.cfg
        if cfg.probability <= 0.0:
            return False
        w = self.window_of(now_s)
        memo = self._decided.get(session_id)
        if memo is not None and memo[0] == w:
            return memo[1]
        ok = self.chance(session_id, call_id, w) < cfg.probability
        if ok:
            history = self._grants.setdefault(session_id, deque())
            period_windows = cfg.session_period_s / cfg.window_s
            while history and history[0] <= w - period_windows:
                history.popleft()
            ok = len(history) < cfg.max_per_session
            gw, count = self._window_grants
            if gw != w:
                count = 0
            ok = ok and count < cfg.max_global
            if ok:
                history.append(w)
                self._window_grants = (w, count + 1)
        self._decided[session_id] = (w, ok)
        return ok

    def grants_in_window(self, now_s: float) -> int:
        gw, count = self._window_grants
        return count if gw == self.window_of(now_s) else 0

    def forget(self, session_id: str) -> None:
        self._decided.pop(session_id, None)
        self._grants.pop(session_id, None)


def call_readiness(
    call: CallState, info: CommandInfo, now_s: float, cfg: PredictorConfig
) -> tuple[ReadyReason, float | None]:
    """(reason, deadline_at_s) for one running call, before exploration.

    OVERDUE here means "exploration may apply"; the caller asks the ``Explorer``.
    """
    if now_s - call.made_at_s > cfg.stale_after_s:
        return ReadyReason.STALE, None
    h = cfg.horizon_s
    d = call.effective_deadline_s(info)
    d_at = None if d is None else call.started_at_s + d
    if d_at is not None and d_at - h <= now_s <= d_at + cfg.deadline_grace_s:
        return ReadyReason.DEADLINE, d_at
    t_hat = call.started_at_s + call.expected_s
    if now_s < t_hat - h:
        return ReadyReason.PENDING, d_at
    if now_s <= t_hat + cfg.overdue_grace_s:
        return ReadyReason.PREDICTED, d_at
    return ReadyReason.OVERDUE, d_at


def call_next_change_s(call: CallState, info: CommandInfo, now_s: float, cfg: PredictorConfig) -> float:
    """Earliest time after ``now_s`` at which ``call_readiness`` can change (inf if never)."""
    h = cfg.horizon_s
    t_hat = call.started_at_s + call.expected_s
    candidates = [call.made_at_s + cfg.stale_after_s, t_hat - h, t_hat + cfg.overdue_grace_s]
    d = call.effective_deadline_s(info)
    if d is not None:
        d_at = call.started_at_s + d
        candidates += [d_at - h, d_at + cfg.deadline_grace_s]
    later = [c for c in candidates if c > now_s]
    return just_after(min(later)) if later else math.inf


def just_after(t_s: float) -> float:
    """A time strictly after ``t_s`` by a few ulps: boundaries are inclusive, so a change
    is visible only just past them (works for virtual seconds and Unix seconds alike)."""
    return t_s + max(1e-9, 4 * math.ulp(t_s))
