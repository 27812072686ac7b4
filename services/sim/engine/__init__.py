"""vLLM V1 engine model (pure, virtual time): block pool, scheduler, step-time roofline.

Public API: ``Engine``, ``EngineRequest``, ``StepResult``, ``FinishedRequest``, profiles
(``PROFILES``, ``get_profile``, ``Profile``) and token content (``services.sim.engine.tokens``).
"""

from services.sim.engine.engine import Engine, length_violation
from services.sim.engine.kv_cache import BlockPool, KVRequest
from services.sim.engine.profiles import PROFILES, Profile, get_profile
from services.sim.engine.step_time import StepTimeModel
from services.sim.engine.tokens import (
    BLOCK_SIZE,
    ChainCache,
    SyntheticContent,
    TokenContent,
    TokenListContent,
    synthetic_content,
    synthetic_token_id,
)
from services.sim.engine.types import (
    FINISH_ABORT,
    FINISH_LENGTH,
    FINISH_STOP,
    EngineRequest,
    FinishedRequest,
    StepResult,
)

__all__ = [
    "BLOCK_SIZE",
    "FINISH_ABORT",
    "FINISH_LENGTH",
    "FINISH_STOP",
    "PROFILES",
    "BlockPool",
    "ChainCache",
    "Engine",
    "EngineRequest",
    "FinishedRequest",
    "KVRequest",
    "Profile",
    "StepResult",
    "StepTimeModel",
    "SyntheticContent",
    "TokenContent",
    "TokenListContent",
    "get_profile",
    "length_violation",
    "synthetic_content",
    "synthetic_token_id",
]
