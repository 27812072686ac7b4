"""Proto conversions shared by several services' gRPC edges (each service's own are in its
``convert.py``): the session phase (``services.common.vocabulary.Phase``) as
``tao.common.v1.SessionPhase``, one map each way (the router's admin service and the planner's
snapshot use them)."""

from __future__ import annotations

from services.common.vocabulary import Phase
from tao.common.v1 import common_pb2

PHASE_TO_PROTO: dict[Phase, common_pb2.SessionPhase.ValueType] = {
    "WAITING": common_pb2.SESSION_PHASE_WAITING,
    "RUNNING": common_pb2.SESSION_PHASE_RUNNING,
    "ACTING": common_pb2.SESSION_PHASE_ACTING,
    "PAUSED": common_pb2.SESSION_PHASE_PAUSED,
    "ENDED": common_pb2.SESSION_PHASE_ENDED,
}
PHASE_FROM_PROTO: dict[common_pb2.SessionPhase.ValueType, Phase] = {v: k for k, v in PHASE_TO_PROTO.items()}

__all__ = ["PHASE_FROM_PROTO", "PHASE_TO_PROTO"]
