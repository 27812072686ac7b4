"""Plain-dict form of a running call (for persistence; see ``Predictor.session_state``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.predictor.core.estimate import CallState
from services.predictor.core.model import Evidence


def _pair(value: Any) -> tuple[float, float] | None:
    if value is None:
        return None
    a, b = value
    return float(a), float(b)


def _opt(value: Any) -> float | None:
    return None if value is None else float(value)


def call_to_dict(call: CallState) -> dict[str, Any]:
    return {
        "id": call.call_id,
        "tool": call.tool,
        "cmd": call.command,
        "start": call.started_at_s,
        "known": call.start_known,
        "made": call.made_at_s,
        "dl": call.deadline_s,
        "eta": None if call.eta is None else list(call.eta),
        "f0": None if call.frac_first is None else list(call.frac_first),
        "f1": None if call.frac_last is None else list(call.frac_last),
        "exp": call.expected_s,
        "ev": call.evidence.value,
    }


def call_from_dict(raw: Mapping[str, Any]) -> CallState:
    """Inverse of ``call_to_dict``; KeyError/TypeError/ValueError on malformed input."""
    return CallState(
        call_id=str(raw["id"]),
        tool=str(raw["tool"]),
        command=str(raw["cmd"]),
        started_at_s=float(raw["start"]),
        start_known=bool(raw["known"]),
        made_at_s=float(raw["made"]),
        deadline_s=_opt(raw.get("dl")),
        eta=_pair(raw.get("eta")),
        frac_first=_pair(raw.get("f0")),
        frac_last=_pair(raw.get("f1")),
        expected_s=float(raw["exp"]),
        evidence=Evidence(raw["ev"]),
    )
