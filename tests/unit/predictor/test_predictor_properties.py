"""Property tests: any event sequence keeps the core's invariants (never crashes, remaining =
max(0, Ê − elapsed), readiness consistent with its reason, state round-trips)."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from services.predictor.core import (
    EventType,
    InvalidEventError,
    Predictor,
    PredictorConfig,
    ReadyReason,
    ToolEvent,
)

_events = st.lists(
    st.builds(
        ToolEvent,
        t=st.floats(min_value=0, max_value=200, allow_nan=False),
        session_id=st.sampled_from(["a", "b"]),
        call_id=st.sampled_from(["c1", "c2", "c3"]),
        type=st.sampled_from(list(EventType)),
        tool=st.sampled_from(["bash", "edit", ""]),
        command=st.sampled_from(["", "sleep 3", "make -j4", "timeout 5 pytest", "ls"]),
        deadline_s=st.none() | st.floats(min_value=-1, max_value=100, allow_nan=False),
        eta_s=st.none() | st.floats(min_value=-1, max_value=100, allow_nan=False),
        fraction=st.none() | st.floats(min_value=-0.5, max_value=1.5, allow_nan=False),
    ),
    max_size=30,
)


@settings(max_examples=150, deadline=None)
@given(_events, st.floats(min_value=0, max_value=300, allow_nan=False))
def test_any_event_sequence_keeps_invariants(events: list[ToolEvent], now_s: float) -> None:
    p = Predictor()
    for e in events:
        try:
            pred = p.observe(e)
        except InvalidEventError:
            continue
        assert pred.remaining_s == max(0.0, pred.expected_s - pred.elapsed_s)
        assert pred.expected_s >= 0 and pred.completed == (pred.evidence.value == "completed")
    for sid in ("a", "b"):
        sp = p.predict(sid, now_s)
        assert sp.ready == sp.reason.ready
        assert (sp.remaining_s is None) == (sp.reason in (ReadyReason.STALE, ReadyReason.UNKNOWN))
    q = Predictor.from_state(PredictorConfig(), json.loads(json.dumps(p.to_state())))
    for sid in ("a", "b"):
        assert q.predict(sid, now_s) == p.predict(sid, now_s)
