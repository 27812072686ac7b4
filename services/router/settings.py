"""Router settings (env prefix ``TAO_ROUTER_``; flags of ``tao serve router`` override).

Replicas are given as URLs (``http://host:port``) or ``ID=URL``; an id defaults to
``host:port``. Authentication: with ``api_keys_file`` every /v1 request needs a key from it
(stored hashed); without it the router runs in *dev mode*: the tenant comes from the
``dev_tenant_header`` header (``default_tenant`` when absent). Per-request policies
(round_robin, least_loaded, cache_aware) route each request at once; admission-gating ones
(tao, thunderagent, ...) hold requests until a plan admits the session, and fall back to
``fallback_policy`` run locally when no fresh plan arrived for ``plan_stale_s``.

Holding (``core/hold.py``): a request the plan keeps waiting on purpose is held up to
``plan_hold_timeout_s`` (default 30 model minutes, at least ``plan_hold_tool_factor`` x the
longest tool call seen), as ThunderAgent holds a paused program; 503 + ``Retry-After`` after
the short ``hold_timeout_s`` is kept for overload and failure (nothing can serve the request).

Time (docs/architecture.md#model-time): admission and session constants (``hold_timeout_s``, ``plan_hold_timeout_s``, ``plan_stale_s``,
``session_ttl_s``, ``fallback_interval_s``, ``breaker_open_s``) are model seconds, like every
timestamp the router shares; I/O pacing and network timeouts (``health_interval_s``,
``probe_timeout_s``, ``upstream_*_timeout_s``, ``flush_interval_s``, ``demand_interval_s``,
``resync_interval_s``, ``plan_poll_s``) are wall seconds. With ``time_scale`` 1 they agree.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import SettingsConfigDict

from services.common.kv_events import KvEventSource
from services.common.settings import ServiceSettings


class Settings(ServiceSettings):
    model_config = SettingsConfigDict(
        env_prefix="TAO_ROUTER_", extra="forbid", validate_default=True, env_nested_delimiter="__"
    )
    service_name: ClassVar[str] = "router"

    # --- HTTP gateway
    http_host: str = Field(default="127.0.0.1", description="OpenAI-compatible HTTP bind address")
    http_port: int = Field(default=8000, ge=0, le=65535, description="HTTP port (0 picks a free one)")
    max_body_bytes: int = Field(default=32 * 1024 * 1024, ge=1024, description="larger bodies get 413")
    max_held_requests: int = Field(default=10_000, ge=1, description="held requests beyond this get 503")

    # --- replicas
    replicas: list[str] = Field(default_factory=list, description="replica URLs or ID=URL")
    replica_kv_capacity_tokens: int = Field(
        default=0, ge=0, description="KV tokens for replicas without vllm:cache_config_info (0: scrape only)"
    )
    target_utilisation: float = Field(default=0.95, gt=0.0, le=1.0, description="admissible fraction of KV")
    health_interval_s: float = Field(default=1.0, gt=0.0, le=60.0, description="health probe and /metrics scrape")
    probe_timeout_s: float = Field(default=1.0, gt=0.0, le=30.0)
    breaker_failures: int = Field(default=1, ge=1, le=100, description="failures in a row that open the breaker")
    breaker_open_s: float = Field(default=2.0, ge=0.0, le=600.0, description="minimum time a breaker stays open")
    max_attempts: int = Field(default=3, ge=1, le=10, description="replicas a request may try before its first byte")
    upstream_connect_timeout_s: float = Field(default=2.0, gt=0.0, le=60.0)
    upstream_read_timeout_s: float = Field(default=600.0, gt=0.0, description="longest silence between chunks")
    upstream_max_connections: int = Field(default=0, ge=0, description="connection pool size; 0 = unlimited")
    upstream_api_key: SecretStr | None = Field(default=None, description="bearer key sent to replicas")

    # --- admission
    policy: str = Field(default="tao", description="placement policy from the planner registry")
    fallback_policy: str | None = Field(
        default=None, description="policy run locally when the planner is silent; default: the policy "
                                  "itself (tao for the default)")
    plan_stale_s: float = Field(default=5.0, gt=0.0, le=3600.0, description="planner silent after this long")
    fallback_interval_s: float = Field(default=0.25, gt=0.0, le=60.0, description="local fallback period")
    hold_timeout_s: float = Field(
        default=60.0, gt=0.0, le=3600.0,
        description="a request held this long while nothing can serve it -> 503 + Retry-After: no replica "
                    "takes sessions, its replica is down, no live plan (planner silent, local fallback "
                    "failing), its tenant at the budget cap, or a per-request policy finds no replica")
    plan_hold_timeout_s: float = Field(
        default=1800.0, gt=0.0, le=7 * 86400.0,
        description="a request the plan keeps waiting on purpose (session paused or not yet admitted while "
                    "plans are live, a replica up and a tenant slot free) is held, as ThunderAgent does, up "
                    "to this long (or plan_hold_tool_factor x the longest tool call seen, or hold_timeout_s, "
                    "whichever is longest), then 503")
    plan_hold_tool_factor: float = Field(
        default=4.0, ge=0.0, le=1000.0,
        description="the plan hold bound is at least this many times the longest tool call the router has "
                    "seen (a session's time between a request's end and its next request); 0: off")
    retry_after_s: int = Field(default=2, ge=0, le=3600, description="Retry-After of a 503")
    session_ttl_s: float = Field(default=900.0, gt=0.0, description="idle sessions end after this long")
    default_output_tokens: int = Field(default=256, ge=1, description="expected output of a new session")
    ewma_alpha: float = Field(default=0.3, gt=0.0, le=1.0)
    prompt_length: Literal["tokenize", "local", "estimate"] = Field(
        default="tokenize",
        description="exact prompt tokens of a session's first request (prompt_length.py): 'tokenize' asks the "
                    "local tokenizer if set, else a replica's POST /tokenize; 'local' the local tokenizer only; "
                    "'estimate' never (characters / 4)")
    tokenize_timeout_s: float = Field(default=0.1, gt=0.0, le=10.0,
                                      description="longest wait for a replica's /tokenize answer (wall s); "
                                                  "slower: the estimate stands")
    tokenizer: str | None = Field(
        default=None, description="Hugging Face tokenizer name or path for exact prompt lengths without a round "
                                  "trip (needs transformers installed; its chat template is used)")
    predictor_address: str | None = Field(
        default=None, description="predictor gRPC host:port: the tool calls read from answers are reported to it "
                                  "as tool events (tool_events.py); unset: not reported")
    predictor_ca_file: Path | None = Field(default=None, description="CA bundle for a TLS predictor")
    tool_events: bool = Field(default=True, description="report answers' tool calls to predictor_address")
    default_program_id: str | None = Field(
        default=None, min_length=1, max_length=256,
        description="session of requests that name none (no x-session-id, no program_id); unset: each is a "
                    "single-turn session. ThunderAgent files them all under 'default' (ThunderAgent/app.py "
                    "get_program_id): set 'default' for a harness that relies on that")
    thunderagent_metrics: bool = Field(
        default=False,
        description="GET /metrics answers ThunderAgent's JSON (ThunderAgent/app.py get_metrics) unless the client "
                    "asks for Prometheus text (Accept text/plain or openmetrics, as Prometheus does): harnesses "
                    "written for ThunderAgent read /metrics as JSON without asking; off: JSON only on "
                    "?format=json or Accept: application/json")

    # --- state in Redis
    flush_interval_s: float = Field(default=0.05, ge=0.0, le=5.0,
                                    description="write-behind batching delay (pool changes: 2 ms)")
    demand_interval_s: float = Field(default=1.0, gt=0.0, le=60.0, description="demand records refresh")
    resync_interval_s: float = Field(default=2.0, gt=0.0, le=60.0, description="detect a wiped Redis")
    plan_poll_s: float = Field(default=1.0, gt=0.0, le=60.0, description="re-read plan/allocation keys")

    # --- fleet (fleet.py; docs/architecture.md#router-fleet): N routers on one Redis
    fleet: bool = Field(
        default=False,
        description="run as one of several routers on the same Redis: session ownership with fencing, "
                    "forwarding to the owner, fleet-wide admission slots; off: the sole router")
    router_id: str = Field(default="", max_length=64, pattern=r"^[A-Za-z0-9_.:-]*$",
                           description="this router's id in the fleet (empty: random)")
    advertise_url: str = Field(default="", description="URL other routers forward to (default "
                                                       "http://<http_host>:<http_port>)")
    member_ttl_s: float = Field(default=3.0, gt=0.0, le=600.0,
                                description="fleet member lease (wall s): a dead router's sessions are "
                                            "taken over within about this long")

    # --- KV events (kv_events.py): replicas that publish vLLM's KV-cache events
    kv_events: dict[str, KvEventSource] = Field(
        default_factory=dict,
        description='per replica id, where its KV events are published, e.g. TAO_ROUTER_KV_EVENTS=\'{"r0": '
                    '{"endpoint": "tcp://10.0.0.5:5557", "replay_endpoint": "tcp://10.0.0.5:5558"}}\' (the '
                    "replica runs with --kv-events-config); replicas not listed keep usage-derived credit")
    kv_events_credit: bool = Field(
        default=False,
        description="turn the KV-event index into sessions' kv_events cache credit; off by default: on the "
                    "simulator grid exact residency as credit was worse than the decayed usage estimate in 8 of "
                    "9 configurations (docs/benchmarks.md#cache-credit-accuracy), so the index serves metrics only")
    kv_refresh_s: float = Field(default=0.5, gt=0.0, le=60.0,
                                description="recompute sessions' kv_events credit this often (wall s)")
    kv_replay_timeout_s: float = Field(default=2.0, gt=0.0, le=60.0,
                                       description="wait for a replica's KV-event replay answer (wall s)")

    # --- auth
    api_keys_file: Path | None = Field(default=None, description="YAML/JSON keys file; unset = dev mode")
    dev_tenant_header: str = Field(default="x-tao-tenant", min_length=1)
    default_tenant: str = Field(default="default", min_length=1)
    api_keys_reload_s: float = Field(default=1.0, gt=0.0, le=3600.0,
                                     description="re-read api_keys_file when it changed, checked at most this "
                                                 "often (wall s)")

    # --- rate limits (core/ratelimit.py; fleet-wide in Redis: ratelimit.py)
    rate_limits: dict[str, dict[str, int]] = Field(
        default_factory=dict,
        description='per tenant {"rpm": requests/min, "tpm": tokens/min} (0 or absent: none; "*": every tenant '
                    'not listed), e.g. TAO_ROUTER_RATE_LIMITS=\'{"A": {"rpm": 600, "tpm": 200000}}\'; the keys '
                    "file's 'limits' override it per tenant; model time")
    rate_limit_timeout_s: float = Field(default=0.25, gt=0.0, le=10.0,
                                        description="Redis answer wait of a rate-limit check; slower: the request "
                                                    "passes (fail open, wall s)")

    @field_validator("replicas", mode="before")
    @classmethod
    def _split_replicas(cls, value: object) -> object:
        if isinstance(value, str):
            return [v.strip() for v in value.split(",") if v.strip()]
        return value

    @field_validator("replicas")
    @classmethod
    def _check_replicas(cls, value: list[str]) -> list[str]:
        from services.router.replicas import parse_replica_spec

        ids = [parse_replica_spec(spec)[0] for spec in value]  # InvalidArgument is a ValueError
        if len(set(ids)) != len(ids):
            raise ValueError(f"duplicate replica ids in {value}")
        return value

    @field_validator("advertise_url")
    @classmethod
    def _check_advertise_url(cls, value: str) -> str:
        if value and not (value.startswith(("http://", "https://")) and len(value.split("//", 1)[1]) > 0):
            raise ValueError("advertise_url must be an http:// or https:// URL (or empty: http://host:port)")
        return value.rstrip("/")

    @field_validator("rate_limits")
    @classmethod
    def _check_rate_limits(cls, value: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
        from services.router.core.ratelimit import parse_limits

        parse_limits(value, "rate_limits")
        return value

    @field_validator("api_keys_file")
    @classmethod
    def _keys_file_exists(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_file():
            raise ValueError(f"file not found: {value}")
        return value

    @field_validator("policy", "fallback_policy")
    @classmethod
    def _known_policy(cls, value: str | None) -> str | None:
        from services.planner.core.registry import POLICIES

        if value is not None and value not in POLICIES:
            raise ValueError(f"unknown policy {value!r}; registered: {', '.join(sorted(POLICIES))}")
        return value
