"""The Redis key schema: every key and channel TAO uses, and who writes it.

One writer per family (docs/architecture.md#one-writer-per-key-family). A service may add
keys only under its own prefix ``{tao}:<service>:``; values are JSON records from
``services.common.records`` that carry the writer's epoch and revision.

Every key starts with the hash tag ``{tao}``, so on a Redis Cluster all of them live in one
slot (docs/architecture.md#redis-cluster-and-sentinel): the planner's snapshot reads the
router's, predictor's and budget's keys in one MULTI/EXEC, and fenced writes (Lua) touch a
lease key and the keys it guards together, which Cluster allows only within one slot.
"""

from __future__ import annotations

#: the hash tag every key starts with (Redis Cluster hashes only what is between the braces)
HASH_TAG = "tao"
PREFIX = "{" + HASH_TAG + "}"


def epoch_key(service: str) -> str:
    """The live epoch of ``service`` (string). Written by that service with every publish."""
    return f"{PREFIX}:{service}:epoch"


def lease_key(role: str) -> str:
    """The leader lease of ``role`` (string: the holder's random token, with a PX expiry);
    written only through the Lua scripts of ``services.common.lease``."""
    return f"{PREFIX}:{role}:leader"


def term_key(role: str) -> str:
    """The term counter of ``role`` (integer, INCR at every takeover, in the acquiring script)."""
    return f"{PREFIX}:{role}:term"


# --- router (sole writer) ---------------------------------------------------------------
#: hash: session_id -> SessionRecord JSON (sessions not ENDED; ended ones are deleted)
SESSIONS = f"{PREFIX}:router:sessions"
#: hash: replica_id -> ReplicaRecord JSON
REPLICAS = f"{PREFIX}:router:replicas"
#: hash: tenant -> TenantDemandRecord JSON (read by the budget service); in fleet mode one field
#: per router, ``<tenant>@<router id>``, summed per tenant by the readers (common/fleet.py)
DEMAND = f"{PREFIX}:router:demand"
#: pub/sub: the router publishes the session id whenever the pool changes (planner debounces)
POOL_CHANNEL = f"{PREFIX}:router:pool"
#: hash per tenant ``{tao}:router:ratelimit:<tenant>`` -> {r, t}: the GCRA state (TAT, integer
#: microseconds) of its requests-per-minute and tokens-per-minute limits. Every router of a
#: fleet writes it, only through one atomic Lua script (services/router/ratelimit.py); no other
#: service reads or writes it. Expires a minute after the tenant's last request.
RATE_LIMITS = f"{PREFIX}:router:ratelimit"


def rate_limit_key(tenant: str) -> str:
    """The rate-limit state of ``tenant`` (a member of the ``RATE_LIMITS`` family)."""
    return f"{RATE_LIMITS}:{tenant}"


# --- router fleet (``fleet`` on; docs/architecture.md#router-fleet). Every router of a fleet
# writes these, only through the Lua scripts of services/common/fleet.py.
#: sorted set: router id -> its member lease deadline (Redis ``TIME`` in ms); a router whose
#: score is in the past is dead (its sessions and slots may be taken)
ROUTER_ALIVE = f"{PREFIX}:router:alive"
#: hash: router id -> RouterMemberRecord-like JSON ``{"url": advertise_url, "epoch": writer epoch}``
ROUTER_MEMBERS = f"{PREFIX}:router:members"
#: hash: router id -> its writer epoch (replaces ``epoch_key("router")`` in fleet mode)
ROUTER_EPOCHS = f"{PREFIX}:router:epochs"
#: hash: session id -> ``"<revision> <router id>"``: the session's owner; the revision (the
#: fencing token) grows at every takeover
SESSION_OWNERS = f"{PREFIX}:router:owners"
#: hash per tenant ``{tao}:router:slots:<tenant>``: router id -> admission slots it holds
#: (Σ <= the tenant's budget cap), ``~<router id>`` -> 1 while that router wants more
SLOTS = f"{PREFIX}:router:slots"


def slots_key(tenant: str) -> str:
    """The admission-slot allotments of ``tenant`` (a member of the ``SLOTS`` family)."""
    return f"{SLOTS}:{tenant}"


# --- predictor (sole writer) --------------------------------------------------------------
#: hash: session_id -> PredictionRecord JSON
PREDICTIONS = f"{PREFIX}:predictor:predictions"
#: hash: history key -> predictor-core history state JSON
PREDICTOR_HISTORY = f"{PREFIX}:predictor:history"
#: pub/sub: PredictionRecord JSON whenever a session's readiness changes
READINESS_CHANNEL = f"{PREFIX}:predictor:readiness"

# --- planner (sole writer) ----------------------------------------------------------------
#: string: the latest PlanRecord JSON
PLAN = f"{PREFIX}:planner:plan"
#: pub/sub: PlanRecord JSON of every published plan
PLAN_CHANNEL = f"{PREFIX}:planner:plans"

# --- budget (sole writer) -----------------------------------------------------------------
#: string: the latest AllocationRecord JSON
ALLOCATION = f"{PREFIX}:budget:allocation"
#: pub/sub: AllocationRecord JSON of every published allocation
ALLOCATION_CHANNEL = f"{PREFIX}:budget:allocations"
#: string: BudgetConfigRecord JSON (tenants, total, policy)
BUDGET_CONFIG = f"{PREFIX}:budget:config"

#: family -> owning service, used by tests that check the one-writer rule
OWNERS: dict[str, str] = {
    SESSIONS: "router",
    REPLICAS: "router",
    DEMAND: "router",
    POOL_CHANNEL: "router",
    RATE_LIMITS: "router",
    ROUTER_ALIVE: "router",
    ROUTER_MEMBERS: "router",
    ROUTER_EPOCHS: "router",
    SESSION_OWNERS: "router",
    SLOTS: "router",
    PREDICTIONS: "predictor",
    PREDICTOR_HISTORY: "predictor",
    READINESS_CHANNEL: "predictor",
    PLAN: "planner",
    PLAN_CHANNEL: "planner",
    ALLOCATION: "budget",
    ALLOCATION_CHANNEL: "budget",
    BUDGET_CONFIG: "budget",
}


def owner_of(key: str) -> str:
    """The service allowed to write ``key`` (its ``{tao}:<service>:`` prefix)."""
    parts = key.split(":")
    if len(parts) < 3 or parts[0] != PREFIX:
        raise ValueError(f"{key!r} is not a TAO key")
    return parts[1]
