"""Readiness r(s) for the router's local fallback snapshot (docs/algorithms.md#readiness).

The planner computes readiness itself from the predictor's records; the router needs it only
when it plans locally (planner silent). r = 1 when a request is held (handled by the
snapshot builder) or when the predictor's latest prediction for the session's current tool
call says so: the prediction must be fresh (refreshed within ``fresh_s``, 30 s) and
belong to the current tool call (started after the session's last request ended, with
``skew_s`` of slack for clocks); then it is ready when the predictor flagged it (completion,
deadline, exploration) or the predicted return or exposed deadline is within ``horizon_s``.
If the predictor is down, its records go stale and readiness comes only from held requests.
"""

from __future__ import annotations

from dataclasses import dataclass

HORIZON_S = 1.0  # docs/algorithms.md#readiness: ready when the predicted completion is within 1 s
FRESH_S = 30.0  # docs/algorithms.md#readiness: only predictions refreshed within 30 s count


@dataclass(frozen=True, slots=True)
class PredictionView:
    """The fields of the predictor's ``PredictionRecord`` readiness needs (Unix seconds)."""

    ready: bool
    started_at_unix_s: float
    refreshed_at_unix_s: float
    predicted_return_unix_s: float
    deadline_unix_s: float | None = None


def is_current(
    pred: PredictionView,
    now_unix_s: float,
    acting_since_unix_s: float | None,
    fresh_s: float = FRESH_S,
    skew_s: float = 0.5,
) -> bool:
    """The prediction is fresh and belongs to the session's current tool call."""
    if now_unix_s - pred.refreshed_at_unix_s > fresh_s:
        return False
    return acting_since_unix_s is None or pred.started_at_unix_s >= acting_since_unix_s - skew_s


def is_ready(
    pred: PredictionView,
    now_unix_s: float,
    acting_since_unix_s: float | None,
    horizon_s: float = HORIZON_S,
    fresh_s: float = FRESH_S,
    skew_s: float = 0.5,
) -> bool:
    if not is_current(pred, now_unix_s, acting_since_unix_s, fresh_s, skew_s):
        return False  # stale, or a prediction for a tool call before the last request
    if pred.ready:
        return True
    if pred.predicted_return_unix_s - now_unix_s <= horizon_s:
        return True
    return pred.deadline_unix_s is not None and pred.deadline_unix_s - now_unix_s <= horizon_s
