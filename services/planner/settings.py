"""Planner service settings (env prefix ``TAO_PLANNER_``; flags of ``tao serve planner`` override).

Times are model seconds (``ServiceSettings.time_scale``, docs/architecture.md#model-time).
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, field_validator
from pydantic_settings import SettingsConfigDict

from services.common.settings import LeaderElectionSettings
from services.planner.core.fits import engine_fits
from services.planner.core.registry import POLICIES


class Settings(LeaderElectionSettings):
    model_config = SettingsConfigDict(
        env_prefix="TAO_PLANNER_", extra="forbid", validate_default=True, env_nested_delimiter="__"
    )
    service_name: ClassVar[str] = "planner"

    policy: str = Field(default="tao", description="policy from the registry that plans published rounds")
    engine_profile: str | None = Field(
        default=None,
        description="engine profile whose prefill and decode time fits the policy uses (services/planner/core/fits.py; "
                    "default: qwen3-32b-h100x2's)")
    tick_s: float = Field(default=1.0, gt=0.0, le=3600.0, description="periodic re-plan period")
    debounce_s: float = Field(default=0.05, ge=0.0, le=60.0,
                              description="after a pool change, wait this long for more before planning")
    ready_horizon_s: float = Field(default=1.0, ge=0.0, le=60.0,
                                   description="ready when the predicted return is this close (docs/algorithms.md#readiness)")
    prediction_fresh_s: float = Field(default=30.0, gt=0.0, le=3600.0,
                                      description="only predictions refreshed this recently count (docs/algorithms.md#readiness)")
    use_tenant_headroom: bool = Field(default=True,
                                      description="cap new admissions per tenant at budget cap minus in flight")
    watch_queue_size: int = Field(default=64, ge=1, le=10_000, description="plans buffered per slow watcher")

    @field_validator("engine_profile")
    @classmethod
    def _known_engine_profile(cls, value: str | None) -> str | None:
        if value is not None:
            engine_fits(value)  # ValueError naming the profiles that have fits
        return value

    @field_validator("policy")
    @classmethod
    def _known_policy(cls, value: str) -> str:
        if value not in POLICIES:
            raise ValueError(f"unknown policy {value!r}; choose one of: {', '.join(sorted(POLICIES))}")
        return value
