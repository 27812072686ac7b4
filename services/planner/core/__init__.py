"""TAO planner core: pure (no I/O, no wall clock), deterministic, exact integer values.

Public API (docs/architecture.md#planner-core-api): the model (``Snapshot`` -> ``Plan``),
the ``Policy`` protocol and the registry (``POLICIES``, ``make_policy``). See
docs/algorithms.md and each module's docstring.
"""

from services.common.core.evidence import CacheEvidence
from services.planner.core.model import (
    Assignment,
    Objective,
    Plan,
    ReplicaState,
    SessionState,
    Snapshot,
    SnapshotError,
)
from services.planner.core.policy import Policy
from services.planner.core.registry import POLICIES, UnknownPolicyError, make_policy

__all__ = [
    "POLICIES",
    "Assignment",
    "CacheEvidence",
    "Objective",
    "Plan",
    "Policy",
    "ReplicaState",
    "SessionState",
    "Snapshot",
    "SnapshotError",
    "UnknownPolicyError",
    "make_policy",
]
