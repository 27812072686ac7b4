"""Records shared through Redis. These are contracts between services: change them
deliberately, keeping old fields readable (``extra="ignore"`` lets readers skip new ones).

Every record carries the writer's ``epoch`` (start-up id) and ``rev`` (monotonic within
the epoch) — see ``services.common.epoch``. Times shared between processes are Unix
seconds (``*_unix_s``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    ValidationError,
)

from services.common.core.evidence import CacheEvidence
from services.common.core.ratelimit import NO_LIMIT, RateLimit
from services.common.vocabulary import DEFAULT_BLOCK_SIZE, Phase


class RecordError(ValueError):
    """A stored value could not be read as the expected record."""


class Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    epoch: str = Field(min_length=1)
    rev: int = Field(ge=0)


def _evidence_from_wire(value: Any) -> Any:
    """The stored form names the time ``observed_at_unix_s`` (records keep Unix seconds)."""
    if isinstance(value, Mapping) and "observed_at_unix_s" in value:
        return {**{k: v for k, v in value.items() if k != "observed_at_unix_s"},
                "observed_at_s": value["observed_at_unix_s"]}
    return value


def _evidence_checked(e: CacheEvidence) -> CacheEvidence:
    if min(e.resident_tokens, e.prompt_tokens, e.cached_tokens, e.processed_tokens) < 0:
        raise ValueError("cache evidence token counts must be >= 0")
    return e


def _evidence_to_wire(e: CacheEvidence) -> dict[str, Any]:
    return {
        "replica": e.replica,
        "resident_tokens": e.resident_tokens,
        "prompt_tokens": e.prompt_tokens,
        "cached_tokens": e.cached_tokens,
        "processed_tokens": e.processed_tokens,
        "observed_at_unix_s": e.observed_at_s,
        "kind": e.kind,
    }


StoredCacheEvidence = Annotated[
    CacheEvidence,
    BeforeValidator(_evidence_from_wire),
    AfterValidator(_evidence_checked),
    PlainSerializer(_evidence_to_wire),
]
"""``CacheEvidence`` as a ``SessionRecord`` stores it: ``observed_at_s`` on the Unix clock,
written (and read) as ``observed_at_unix_s``; every token count >= 0. The JSON is the one the
record has always had: replica, resident_tokens (k0), prompt_tokens and cached_tokens of the
observing request, processed_tokens (volume evidence), observed_at_unix_s, kind."""


class SessionRecord(Record):
    """Router-owned state of one agent session (docs/architecture.md#session-model)."""

    session_id: str
    tenant: str
    phase: Phase
    replica: str | None = None
    admitted: bool = False
    #: the router will pause the session when its in-flight request ends
    pause_pending: bool = False
    context_tokens: int = Field(default=0, ge=0)
    last_prompt_tokens: int = Field(default=0, ge=0)
    last_output_tokens: int = Field(default=0, ge=0)
    ewma_output_tokens: float = Field(default=0.0, ge=0)
    expected_append_tokens: int = Field(default=0, ge=0)
    footprint_tokens: int = Field(default=0, ge=0)
    requests: int = Field(default=0, ge=0)
    last_cached_tokens: int = Field(default=0, ge=0)
    last_ttft_s: float | None = None
    #: cache evidence per replica, ``observed_at_s`` in Unix seconds (``StoredCacheEvidence``)
    cache: tuple[StoredCacheEvidence, ...] = ()
    created_at_unix_s: float
    updated_at_unix_s: float
    waiting_since_unix_s: float | None = None
    acting_since_unix_s: float | None = None
    #: the model its latest request named ("" = none: any replica)
    model: str = ""
    #: the prefix it shares with other sessions (system prompt, tools; "" = none) and its
    #: estimated tokens; ``shared_tokens``: the part of its footprint one copy per replica
    #: covers, when the router reserves shared prefixes once (``footprint_tokens`` is then
    #: without it for an admitted session; docs/algorithms.md#footprint)
    prefix_key: str = ""
    prefix_tokens: int = Field(default=0, ge=0)
    shared_tokens: int = Field(default=0, ge=0)


class ReplicaRecord(Record):
    """Router-owned view of one vLLM replica."""

    replica_id: str
    url: str
    healthy: bool
    draining: bool = False
    kv_capacity_tokens: int = Field(ge=0)
    #: admissible capacity: kv_capacity_tokens x target utilisation
    capacity_tokens: int = Field(ge=0)
    used_tokens: int = Field(default=0, ge=0)
    running: int = Field(default=0, ge=0)
    waiting: int = Field(default=0, ge=0)
    kv_cache_usage: float = Field(default=0.0, ge=0.0, le=1.0)
    prefix_hit_rate: float = Field(default=0.0, ge=0.0, le=1.0)
    #: model names its /v1/models lists (empty until known: it serves no named model)
    models: tuple[str, ...] = ()
    #: KV block size in tokens (vllm:cache_config_info; DEFAULT_BLOCK_SIZE until reported)
    block_size: int = Field(default=DEFAULT_BLOCK_SIZE, ge=1)
    updated_at_unix_s: float


class TenantDemandRecord(Record):
    """Router-owned demand of one tenant (budget service input)."""

    tenant: str
    waiting: int = Field(ge=0)
    in_flight: int = Field(ge=0)
    p99_latency_s: float = Field(default=0.0, ge=0.0)
    #: p99 of admission -> end of the tenant's recent requests (0: unknown)
    p99_hold_s: float = Field(default=0.0, ge=0.0)
    updated_at_unix_s: float


class PredictionRecord(Record):
    """Predictor-owned prediction for one session's latest tool call."""

    session_id: str
    call_id: str
    tool: str
    ready: bool
    ready_reason: str
    expected_duration_s: float = Field(ge=0.0)
    remaining_s: float = Field(ge=0.0)
    elapsed_s: float = Field(ge=0.0)
    #: completed | direct_timing | deadline | parsed_sleep | tool_history | global_history | default
    evidence: str
    completed: bool = False
    #: when the call started and when the prediction was refreshed (Unix seconds)
    started_at_unix_s: float
    refreshed_at_unix_s: float
    #: absolute predicted return time, Unix seconds (readers recompute readiness from it)
    predicted_return_unix_s: float
    #: exposed return deadline as an absolute time, when the harness gave one
    deadline_unix_s: float | None = None


class AssignmentRecord(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    session: str
    replica: str


class PlanRecord(Record):
    """Planner-owned published plan."""

    policy: str
    assignments: tuple[AssignmentRecord, ...] = ()
    pauses: tuple[str, ...] = ()
    #: (credit_tokens, ready_sessions, footprint_tokens)
    objective: tuple[int, int, int] = (0, 0, 0)
    upper_bound: tuple[int, int, int] | None = None
    solver: str
    solve_ms: float = Field(ge=0.0)
    excluded_by_rounding: int = Field(default=0, ge=0)
    #: when the snapshot the plan was computed from was read (Unix seconds): revalidation
    #: rejects assignments for sessions whose state changed after it
    snapshot_at_unix_s: float
    created_at_unix_s: float


class DecisionRecord(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    kind: Literal["move", "hold"]
    to_tenant: str = ""
    from_tenant: str = ""
    slots: int = Field(default=0, ge=0)
    reason: str = ""


class AllocationRecord(Record):
    """Budget-owned tenant caps; caps always sum to total."""

    total: int = Field(gt=0)
    caps: dict[str, int]
    #: admission ceilings (also sum to total): a draining donor's limit is below its cap so it
    #: stops refilling slots another tenant is owed; empty means "limits = caps"
    limits: dict[str, int] = Field(default_factory=dict)
    policy: str
    decisions: tuple[DecisionRecord, ...] = ()
    decided_at_unix_s: float
    #: the tenants configured with rate limits (``BudgetService.ConfigureTenants``); every router
    #: applies them ahead of its own limits for those tenants
    rate_limits: dict[str, RateLimit] = Field(default_factory=dict)


class TenantConfigRecord(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    name: str = Field(min_length=1)
    floor: int = Field(default=0, ge=0)
    weight: float = Field(default=1.0, gt=0.0)
    p99_slo_s: float = Field(default=0.0, ge=0.0)
    static_cap: int = Field(default=0, ge=0)
    rate_limit: RateLimit = NO_LIMIT


class BudgetConfigRecord(Record):
    """Budget-owned configuration (survives a budget-service restart)."""

    total_budget: int = Field(gt=0)
    tenants: tuple[TenantConfigRecord, ...]
    policy: str


R = TypeVar("R", bound=BaseModel)


def dump(record: BaseModel) -> str:
    """Serialise a record for Redis."""
    return record.model_dump_json()


def load(cls: type[R], raw: str | bytes | None) -> R:
    """Parse a stored value; ``RecordError`` (never a pydantic traceback) when it is not a ``cls``."""
    if raw is None:
        raise RecordError(f"no {cls.__name__} stored")
    try:
        return cls.model_validate_json(raw)
    except ValidationError as exc:
        raise RecordError(f"stored value is not a valid {cls.__name__}: {exc.errors()[0]['msg']}") from exc
