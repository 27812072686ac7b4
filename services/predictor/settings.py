"""Predictor settings (env prefix ``TAO_PREDICTOR_``; flags of ``tao serve predictor`` override)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from services.common.settings import ServiceSettings
from services.predictor.core import EventLimits, ExplorationConfig, PredictorConfig


class Settings(ServiceSettings):
    model_config = SettingsConfigDict(
        env_prefix="TAO_PREDICTOR_", extra="forbid", validate_default=True, env_nested_delimiter="__"
    )
    service_name: ClassVar[str] = "predictor"

    # --- readiness model (docs/algorithms.md#readiness)
    horizon_s: float = Field(default=1.0, gt=0, le=60, description="ready when completion is within this")
    stale_after_s: float = Field(default=30.0, gt=0, le=3600, description="predictions older than this do not count")
    default_duration_s: float = Field(default=5.0, gt=0, le=3600, description="Ê when nothing is known")
    exploration_probability: float = Field(default=0.2, ge=0, le=1, description="per window, for overdue calls")
    exploration_window_s: float = Field(default=1.0, gt=0, le=60)
    exploration_max_per_session: int = Field(default=3, ge=0, le=1000)
    exploration_max_global: int = Field(default=16, ge=0, le=100_000)
    exploration_seed: int = Field(default=0)
    max_history_keys: int = Field(default=50_000, ge=100, le=10_000_000)

    # --- ingestion
    max_batch_events: int = Field(default=1000, ge=1, le=10_000, description="events per stream message")
    max_command_chars: int = Field(default=16_384, ge=64, le=1_048_576, description="longer commands are rejected")
    max_future_s: float = Field(default=5.0, ge=0, le=3600, description="events stamped further ahead are rejected")
    dedupe_calls_per_session: int = Field(default=16, ge=1, le=10_000, description="calls whose sequences are kept")

    # --- persistence
    snapshot_interval_s: float = Field(default=2.0, gt=0, le=3600, description="state snapshot period")
    snapshot_max_log_events: int = Field(default=100_000, ge=100, description="snapshot early past this log length")
    flush_retry_s: float = Field(default=0.2, gt=0, le=60, description="wait before retrying a failed Redis write")
    flush_timeout_s: float = Field(default=10.0, gt=0, le=600, description="acks wait this long for Redis, then UNAVAILABLE")
    redis_wait_replicas: int = Field(
        default=0, ge=0, le=16, description="acknowledge an event only once this many Redis replicas have it (WAIT); "
        "1 with Sentinel keeps acknowledged events through a failover")

    # --- background loops
    tick_s: float = Field(default=0.05, gt=0, le=10, description="readiness re-evaluation period")
    gc_interval_s: float = Field(default=10.0, gt=0, le=3600)
    watch_queue_size: int = Field(default=10_000, ge=10, description="per watcher; a slower watcher is cut off")

    def predictor_config(self) -> PredictorConfig:
        return PredictorConfig(
            horizon_s=self.horizon_s,
            stale_after_s=self.stale_after_s,
            default_duration_s=self.default_duration_s,
            max_history_keys=self.max_history_keys,
            exploration=ExplorationConfig(
                probability=self.exploration_probability,
                window_s=self.exploration_window_s,
                max_per_session=self.exploration_max_per_session,
                max_global=self.exploration_max_global,
                seed=self.exploration_seed,
            ),
            limits=EventLimits(max_command_chars=self.max_command_chars, max_future_s=self.max_future_s),
        )
