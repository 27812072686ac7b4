"""The router's domain types: frozen dataclasses, exact integer tokens, times in seconds on
the router's clock (``now_s`` passed in; the adapters convert to Unix seconds for Redis).

Phases (docs/architecture.md#session-model) are derived, never stored independently (``phase_of``):
RUNNING while a request is in flight, else WAITING while a request is held, else ACTING when
admitted (a tool runs), else PAUSED (gating policies: the next request will be held) or
ACTING (per-request policies: nothing is held, so "paused" would be misleading). ENDED
sessions are removed from the table.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from services.common.core.evidence import CacheEvidence
from services.common.vocabulary import DEFAULT_BLOCK_SIZE, Phase, serves_model

#: ``CoreConfig.fast_admit``'s rules ("" = off)
FAST_ADMIT_RULES = frozenset({"", "cache", "new-program", "home", "home-only"})
#: ``CoreConfig.accounting``'s rules (``services.router.core.footprint.footprint_tokens``)
ACCOUNTING_RULES = frozenset({"reservation", "program"})


@dataclass(frozen=True, slots=True)
class CoreConfig:
    """Tunables of the router core (the adapter fills them from ``Settings``)."""

    #: admissible fraction of a replica's KV tokens (docs/algorithms.md#footprint: default 0.95)
    target_utilisation: float = 0.95
    #: weight of the newest sample in the output/append EWMAs
    ewma_alpha: float = 0.3
    #: expected output before a session has completed a request (capped by max_tokens)
    default_output_tokens: int = 256
    #: sessions idle (nothing held or in flight) this long end
    session_ttl_s: float = 600.0
    #: admission comes from plans (True) or every request is routed at once (False)
    gating: bool = True
    #: a session keeps its replica between requests (per-request policies may say False)
    sticky: bool = True
    #: a request tries at most this many replicas before its first byte
    max_attempts: int = 3
    #: keep a plan's pause only while its replica is still over capacity once the sessions
    #: already leaving (paused earlier in the plan, or RUNNING and marked) are subtracted
    pause_revalidation: bool = True
    #: gating only: a request of a pool session that nothing else contends with is admitted at
    #: once, without waiting for the planner's debounce and round trip, when its tenant has
    #: headroom and a replica serving it has room. With nobody to rank it against there is no
    #: ordering decision, and the scheduler each rule comes from admits it there and then; the
    #: rules (``FAST_ADMIT_RULES``) differ in what contends and in the replica:
    #: ``""``: never (wait for the plan);
    #: ``"cache"`` (``tao``): no other session is in the pool (held *or* paused: a paused
    #: session may be predicted back and outrank it); the replica with the most cache credit
    #: for it, then the fewest requests in flight, then the most room: the ready-first DP's
    #: choice for one session;
    #: ``"new-program"`` (ThunderAgent, ``scheduler/router.py``
    #: ``_select_backend_for_new_program``, called at the request's arrival): a session with no
    #: cache evidence (a new program) while no other session is in the pool (ThunderAgent's
    #: global waiting queue: every paused program); the replica with the fewest admitted tokens
    #: among those whose room, less 100 tokens of buffer per admitted session, holds its
    #: footprint plus one buffer;
    #: ``"home"`` (Continuum, whose program-level FCFS queue runs in vLLM's scheduler at every
    #: step): no other pool session holds a request (its waiting queue is empty); its last
    #: replica when it fits there, else the replica with the most room that fits it;
    #: ``"home-only"`` (``continuum-affine``, one engine per replica): as ``"home"``, but only on
    #: its last replica (a new session: the replica with the most room).
    #: Set from the policy's ``fast_admit``; a router fleet sets ``""`` (its core does not see
    #: the sessions of the other routers).
    fast_admit: str = ""
    #: gating only: a plan's assignment may take, besides the free room, the reservations of
    #: the sessions admitted on its replica that are between requests (the ``tao-lend`` lever:
    #: the planner lends the reservation of a session whose tool is predicted to outlast the
    #: assigned session's turn, and pauses the borrower first once the replica is over capacity,
    #: so it gives the tokens back when its request ends). Set from the policy's ``lend``.
    lend: bool = False
    #: gating only: with ``pause_revalidation``, a plan's pause that its replica needs only for the
    #: plan's own assignments is dropped once its session holds a request again (a ``tao``
    #: reclaim takes the reservation of a session between requests). Policies whose pauses hold
    #: whatever the session does next (Continuum's TTL expiry unpins) leave it False. Set from
    #: the policy's ``reclaims_between_requests``.
    drop_resumed_reclaims: bool = False
    #: gating only: on a replica whose KV cache holds at most this many tokens (0: none), a
    #: prefix that sessions share (``NewRequest.prefix_key``: the same system prompt and tools)
    #: is reserved once, as vLLM's prefix cache holds it once, not once per session
    #: (docs/algorithms.md#footprint). An admitted session there adds its footprint less the
    #: shared part, and the replica the shared part once for each key its admitted sessions
    #: hold; a pool session counts the shared part only where every replica it may go to
    #: shares and holds its key already. Set from the policy's ``shares_prefixes_below_tokens``
    #: (``tao``: where a decode step with the whole cache read is still bound by the weights).
    share_prefixes_below_tokens: int = 0
    #: what a session counts against its replica's capacity (docs/algorithms.md#footprint):
    #: ``"reservation"``: the footprint f(s), context + expected next append + expected output
    #: (TAO, SJF, Continuum's port); ``"program"``: ThunderAgent's program tokens
    #: (``Program.total_tokens`` in its ``program/state.py``): vLLM's prompt + completion tokens
    #: of the last request, the prompt while a request is held, and while one runs its prompt
    #: plus the expected output (ThunderAgent adds the streamed tokens as they come, every ~20,
    #: ``update_program_tokens_streaming``; the core sees no stream, so it counts the whole
    #: output the request is expected to reach). Set from the policy's ``accounting``.
    accounting: str = "reservation"

    def __post_init__(self) -> None:
        if self.accounting not in ACCOUNTING_RULES:
            raise ValueError(f"accounting must be one of {sorted(ACCOUNTING_RULES)}, got {self.accounting!r}")
        if self.share_prefixes_below_tokens < 0:
            raise ValueError(f"share_prefixes_below_tokens must be >= 0, got {self.share_prefixes_below_tokens}")
        if self.fast_admit not in FAST_ADMIT_RULES:
            raise ValueError(f"fast_admit must be one of {sorted(FAST_ADMIT_RULES)}, got {self.fast_admit!r}")
        if not 0.0 < self.target_utilisation <= 1.0:
            raise ValueError(f"target_utilisation must be in (0, 1], got {self.target_utilisation}")
        if not 0.0 < self.ewma_alpha <= 1.0:
            raise ValueError(f"ewma_alpha must be in (0, 1], got {self.ewma_alpha}")
        if self.default_output_tokens < 1 or self.max_attempts < 1 or self.session_ttl_s <= 0:
            raise ValueError("default_output_tokens, max_attempts and session_ttl_s must be positive")


@dataclass(frozen=True, slots=True)
class TokenStats:
    """What a session's completed requests taught us about its size
    (docs/algorithms.md#footprint)."""

    requests: int = 0
    last_prompt_tokens: int = 0
    last_output_tokens: int = 0
    ewma_output_tokens: float = 0.0
    ewma_append_tokens: float = 0.0

    @property
    def context_tokens(self) -> int:
        """Tokens of the context after the last request (its prompt + its output)."""
        return self.last_prompt_tokens + self.last_output_tokens

    @property
    def expected_append_tokens(self) -> int:
        return round(self.ewma_append_tokens)


@dataclass(slots=True)
class Session:
    """One agent session. Invariants: ``admitted`` implies ``replica`` is set; ``in_flight``
    and ``held`` are >= 0; ``placed_s`` is the last time admission or replica changed.

    The one mutable record of the core: it is the core's own state, updated in place on the
    request path (copying a 20-field record several times per request showed up in the
    profile). Only the core writes it; adapters read it; everything the core hands out as a
    decision (grants, reports, snapshots) is frozen."""

    id: str
    tenant: str
    created_s: float
    updated_s: float
    placed_s: float
    single_turn: bool = False
    replica: str | None = None
    admitted: bool = False
    pause_pending: bool = False
    in_flight: int = 0
    held: int = 0
    tokens: TokenStats = field(default_factory=TokenStats)
    cache: tuple[CacheEvidence, ...] = ()
    #: prompt estimate of the largest held request (0 when none held)
    pending_prompt_tokens: int = 0
    #: smallest max_tokens among held requests (None when not given)
    pending_max_tokens: int | None = None
    #: prompt estimate of the largest request in flight (0 when none): while it runs, that
    #: prompt is the session's context on its replica (a first request has no stats yet)
    inflight_prompt_tokens: int = 0
    #: smallest max_tokens among requests in flight (None when not given or none in flight)
    inflight_max_tokens: int | None = None
    waiting_since_s: float | None = None
    acting_since_s: float | None = None
    last_cached_tokens: int = 0
    last_ttft_s: float | None = None
    footprint_tokens: int = 0
    #: the prefix it shares with other sessions (``NewRequest.prefix_key``; "" = none) and its
    #: estimated tokens; with ``CoreConfig.share_prefixes_below_tokens`` a replica may reserve it once
    prefix_key: str = ""
    prefix_tokens: int = 0
    #: the part of the full footprint a replica's one copy of the shared prefix covers (0 where
    #: its replica does not share prefixes); ``footprint_tokens`` is the full footprint less it
    #: where the copy is (or would be) held already
    shared_tokens: int = 0
    #: a replica failed under this session: its next requests avoid it until re-placed
    avoid: frozenset[str] = frozenset()
    #: the model its latest request named (only replicas serving it are eligible; "" = any)
    model: str = ""

    @property
    def idle(self) -> bool:
        return self.in_flight == 0 and self.held == 0


def phase_of(s: Session, gating: bool) -> Phase:
    """The session phase of ``s`` (see the module docstring)."""
    if s.in_flight > 0:
        return "RUNNING"
    if s.held > 0:
        return "WAITING"
    if s.admitted or not gating:
        return "ACTING"
    return "PAUSED"


@dataclass(frozen=True, slots=True)
class Replica:
    """A replica as the core sees it. ``kv_capacity_tokens`` 0 means not known yet."""

    id: str
    url: str
    kv_capacity_tokens: int = 0
    healthy: bool = False
    draining: bool = False
    running: int = 0
    waiting: int = 0
    kv_cache_usage: float = 0.0
    prefix_hit_rate: float = 0.0
    #: the replica has returned ``prompt_tokens_details`` at least once
    reports_cached_tokens: bool = False
    #: the names its ``/v1/models`` lists (empty until known: then it serves no named model)
    models: tuple[str, ...] = ()
    #: KV block size in tokens (``vllm:cache_config_info``; ``DEFAULT_BLOCK_SIZE`` until known)
    block_size: int = DEFAULT_BLOCK_SIZE

    def capacity_tokens(self, target_utilisation: float) -> int:
        return int(self.kv_capacity_tokens * target_utilisation)

    def serves(self, model: str) -> bool:
        return serves_model(self.models, model)

    @property
    def usable(self) -> bool:
        """May receive new admissions and requests."""
        return self.healthy and not self.draining and self.kv_capacity_tokens > 0


@dataclass(frozen=True, slots=True)
class NewRequest:
    """A request arriving at the gateway (already authenticated and validated)."""

    request_id: str
    session_id: str
    tenant: str
    single_turn: bool
    prompt_tokens_estimate: int
    max_tokens: int | None = None
    #: the request's ``model`` ("" = unnamed: any replica)
    model: str = ""
    #: what the request shares with other sessions' prompts, by content (the gateway's hash of
    #: the model, the tools and the leading system and developer messages; "" = nothing known)
    #: and that part's estimated tokens
    prefix_key: str = ""
    prefix_tokens: int = 0


@dataclass(frozen=True, slots=True)
class HeldRequest:
    request_id: str
    session_id: str
    tenant: str
    arrived_s: float
    prompt_tokens_estimate: int
    max_tokens: int | None
    attempts: int = 0
    exclude: frozenset[str] = frozenset()
    model: str = ""


@dataclass(frozen=True, slots=True)
class InFlight:
    request_id: str
    session_id: str
    tenant: str
    replica: str
    started_s: float
    held: HeldRequest


@dataclass(frozen=True, slots=True)
class Grant:
    """Forward ``request_id`` to ``replica`` now (its slot is already taken)."""

    request_id: str
    session_id: str
    replica: str
    attempt: int


@dataclass(frozen=True, slots=True)
class Usage:
    """``usage`` of a completed request. ``cached_tokens`` is None when the response had no
    ``prompt_tokens_details`` (vLLM omits it unless enabled, the emulator when it is 0)."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class PlanDecision:
    """A plan to apply: from the planner (already fenced by its stamp) or the local fallback.

    ``snapshot_at_s`` is when the plan's input was read (router clock): an assignment for a
    session whose placement changed after it is stale and rejected."""

    assignments: tuple[tuple[str, str], ...]
    pauses: tuple[str, ...]
    snapshot_at_s: float
    source: str


@dataclass(frozen=True, slots=True)
class ApplyReport:
    admitted: tuple[tuple[str, str], ...] = ()
    paused: tuple[str, ...] = ()
    pause_deferred: tuple[str, ...] = ()
    rejected: tuple[tuple[str, str], ...] = ()  # (session, reason)


@dataclass(frozen=True, slots=True)
class Dirty:
    """What changed since the last ``take_dirty`` (the write-behind store's work list)."""

    sessions: frozenset[str]
    ended: frozenset[str]
    tenants: frozenset[str]
    replicas: frozenset[str]
    #: session ids whose pool membership or pool state changed (published to the planner)
    pool: frozenset[str]
