"""The session phase has one proto map each way (services/common/convert.py), used by the
router's admin service and the planner's snapshot conversion."""

from __future__ import annotations

from services.common.convert import PHASE_FROM_PROTO, PHASE_TO_PROTO
from services.common.vocabulary import PHASES
from tao.common.v1 import common_pb2


def test_every_phase_has_its_own_proto_value_and_back() -> None:
    assert tuple(PHASE_TO_PROTO) == PHASES
    assert {PHASE_FROM_PROTO[v] for v in PHASE_TO_PROTO.values()} == set(PHASES)
    for phase, value in PHASE_TO_PROTO.items():
        assert common_pb2.SessionPhase.Name(value) == f"SESSION_PHASE_{phase}"
    assert common_pb2.SESSION_PHASE_UNSPECIFIED not in PHASE_FROM_PROTO
