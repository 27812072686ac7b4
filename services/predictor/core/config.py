"""Predictor tunables (frozen; defaults follow the TAO paper,
docs/algorithms.md#predictor-evidence-hierarchy)."""

from __future__ import annotations

from dataclasses import dataclass, field

from services.predictor.core.events import EventLimits


@dataclass(frozen=True, slots=True)
class ExplorationConfig:
    """Bounded exploration for overdue predictions (docs/algorithms.md#predictor-evidence-hierarchy).

    Time is cut into windows of ``window_s`` on a global grid. In each window an overdue
    session is granted readiness with probability ``probability`` — decided by a hash of
    (``seed``, session, call, window), so the same inputs always give the same grants —
    unless the session already had ``max_per_session`` grants within ``session_period_s``
    or ``max_global`` sessions were already granted in that window (first come, first
    served in query order). ``probability = 0`` disables exploration.
    """

    probability: float = 0.2
    window_s: float = 1.0
    max_per_session: int = 3
    session_period_s: float = 30.0
    max_global: int = 16
    seed: int = 0

    def __post_init__(self) -> None:
        if not (0.0 <= self.probability <= 1.0):
            raise ValueError("exploration probability must be in [0, 1]")
        if self.window_s <= 0 or self.session_period_s <= 0:
            raise ValueError("exploration window and period must be > 0")
        if self.max_per_session < 0 or self.max_global < 0:
            raise ValueError("exploration limits must be >= 0")


@dataclass(frozen=True, slots=True)
class PredictorConfig:
    #: readiness horizon: ready when predicted completion / deadline is within this (the TAO paper: 1 s)
    horizon_s: float = 1.0
    #: a prediction not refreshed by an event within this long does not count (the TAO paper: 30 s)
    stale_after_s: float = 30.0
    #: Ê when nothing is known (the TAO paper: 5 s)
    default_duration_s: float = 5.0
    #: a predicted completion counts as ready until this long after it; later it is overdue
    overdue_grace_s: float = 0.5
    #: an exposed deadline counts as ready until this long after it
    deadline_grace_s: float = 0.5
    #: history ring size and recency weight per observation (see history.py)
    history_window: int = 16
    history_decay: float = 0.9
    max_history_keys: int = 50_000
    #: samples needed before a history level is trusted, strongest level first
    min_samples_session_command: int = 2
    min_samples_command: int = 1
    min_samples_shape: int = 2
    #: test runs: the same target with other flags; the same kind of target in the same
    #: directories; the same kind of target anywhere (then the program)
    min_samples_target: int = 1
    min_samples_place: int = 2
    min_samples_scope: int = 3
    min_samples_program: int = 3
    min_samples_tool: int = 3
    min_samples_global: int = 5
    min_samples_deadline_ratio: int = 3
    #: a tool whose median duration/deadline ratio is at least this runs to its deadline
    deadline_bound_ratio: float = 0.9
    #: what a parsed sleep adds before anything about the command is learned (process start, I/O)
    sleep_residual_default_s: float = 0.05
    #: fractions below this are too early to extrapolate from
    min_fraction: float = 0.02
    #: sessions idle (no running call) this long are forgotten by ``gc``
    session_ttl_s: float = 900.0
    #: a running call with no event for this long is dropped by ``gc`` (its runner is gone)
    call_ttl_s: float = 3_600.0
    #: finished call ids remembered per session to recognise late duplicates
    tombstones_per_session: int = 16
    #: parsed commands kept in the LRU cache
    parse_cache_size: int = 8_192
    exploration: ExplorationConfig = field(default_factory=ExplorationConfig)
    limits: EventLimits = field(default_factory=EventLimits)

    def __post_init__(self) -> None:
        for name in ("horizon_s", "stale_after_s", "default_duration_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0")
        if self.overdue_grace_s < 0 or self.deadline_grace_s < 0:
            raise ValueError("grace periods must be >= 0")
