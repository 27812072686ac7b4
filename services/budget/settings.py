"""Budget service settings (env prefix ``TAO_BUDGET_``; flags of ``tao serve budget`` override).

The tenant set can come from here (``total_budget`` + ``tenants``) but a configuration stored
in Redis by an earlier ``ConfigureTenants`` wins at start-up: that is how a restarted
service resumes. Without either, the service waits for ``ConfigureTenants``.
"""

from __future__ import annotations

import argparse
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from services.budget.core import POLICIES, BudgetConfig, BudgetConfigError, DynamicParams, TenantConfig
from services.common.core.ratelimit import RateLimit
from services.common.settings import LeaderElectionSettings


class TenantSpec(BaseModel):
    """One tenant as written in a config file (the fields of the proto ``TenantConfig``, its
    ``rate_limit`` as ``rpm`` and ``tpm``)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    floor: int = Field(default=0, ge=0)
    weight: float = Field(default=1.0, gt=0.0)
    p99_slo_s: float = Field(default=0.0, ge=0.0, description="0: no SLO")
    static_cap: int = Field(default=0, ge=0, description="0: weighted split under the static policy")
    rpm: int = Field(default=0, ge=0, description="requests per minute, enforced by every router (0: none)")
    tpm: int = Field(default=0, ge=0, description="tokens per minute, enforced by every router (0: none)")


TENANT_FORM = "NAME[:FLOOR[:WEIGHT[:RPM[:TPM]]]]"


def parse_tenant(spec: str) -> TenantSpec:
    """NAME[:FLOOR[:WEIGHT[:RPM[:TPM]]]] (an empty field keeps its default: ``A::::200000``)."""
    parts = spec.split(":")
    if not parts[0] or len(parts) > 5:
        raise argparse.ArgumentTypeError(f"expected {TENANT_FORM}, got {spec!r}")
    parts += [""] * (5 - len(parts))
    try:
        return TenantSpec(name=parts[0], floor=int(parts[1] or 0), weight=float(parts[2] or 1.0),
                          rpm=int(parts[3] or 0), tpm=int(parts[4] or 0))
    except ValueError as exc:  # int()/float(), and pydantic's ValidationError (a ValueError)
        raise argparse.ArgumentTypeError(f"bad tenant {spec!r}: {exc}") from exc


class Settings(LeaderElectionSettings):
    model_config = SettingsConfigDict(
        env_prefix="TAO_BUDGET_", extra="forbid", validate_default=True, env_nested_delimiter="__"
    )
    service_name: ClassVar[str] = "budget"

    tick_s: float = Field(default=2.0, gt=0.0, le=3600.0, description="reallocation period")
    policy: str = Field(default="dynamic", description="static | dynamic (until SetPolicy changes it)")
    total_budget: int | None = Field(default=None, gt=0, description="B when no configuration is stored")
    tenants: list[TenantSpec] = Field(default_factory=list, description="tenants when none are stored")
    demand_stale_s: float = Field(default=10.0, gt=0.0, description="older demand reports are ignored")
    step_frac: float = Field(default=0.25, gt=0.0, le=1.0, description="max gain per tick, fraction of B")
    min_move_slots: int = Field(default=2, ge=1, description="hysteresis: smaller gaps are held")
    headroom_frac: float = Field(default=0.10, ge=0.0, le=10.0)
    release_per_tick: float = Field(default=0.25, ge=0.0, le=1.0, description="demand envelope decay")
    slo_boost: float = Field(default=4.0, ge=1.0, le=100.0)
    kv_saturation_frac: float = Field(default=0.98, gt=0.0, le=1.0)
    burst_reserve_frac: float = Field(default=1.0, ge=0.0, le=1.0,
                                      description="fraction of a tenant's burst peak kept as reserve (0: none)")
    burst_memory_s: float = Field(default=30.0, ge=0.0, description="idle time after which the burst peak decays")
    lend_horizon_s: float = Field(default=5.0, ge=0.0,
                                  description="lend an idle tenant's reserve while at least this much (or its "
                                              "measured call-back time, or the borrowers' p99 slot hold) of its "
                                              "shortest gap remains (0: never)")
    reserve_z: float = Field(default=1.65, ge=0.0, le=10.0,
                             description="burst reserve headroom in Poisson standard deviations of the peak")
    lend_frac: float = Field(default=1.0, ge=0.0, le=1.0, description="fraction of the reserve lent in a gap")
    slo_guard_frac: float = Field(default=0.8, gt=0.0,
                                  description="p99 above this fraction of the SLO: the tenant lends nothing")
    watch_queue_size: int = Field(default=64, ge=1, description="allocations buffered per slow watcher")

    @field_validator("policy")
    @classmethod
    def _known_policy(cls, value: str) -> str:
        if value not in POLICIES:
            raise ValueError(f"unknown policy {value!r}; choose one of: {', '.join(sorted(POLICIES))}")
        return value

    @model_validator(mode="after")
    def _check_tenants(self) -> Settings:
        if bool(self.tenants) != (self.total_budget is not None):
            raise ValueError("total_budget and tenants must be given together")
        self.initial_config()  # raises with the exact reason
        return self

    def initial_config(self) -> BudgetConfig | None:
        if self.total_budget is None:
            return None
        try:
            return BudgetConfig(self.total_budget, tuple(
                TenantConfig(t.name, t.floor, t.weight, t.p99_slo_s or None, t.static_cap or None,
                             RateLimit(t.rpm, t.tpm))
                for t in self.tenants
            ))
        except BudgetConfigError as exc:
            raise ValueError(str(exc)) from exc

    def dynamic_params(self) -> DynamicParams:
        return DynamicParams(
            step_frac=self.step_frac, min_move_slots=self.min_move_slots, headroom_frac=self.headroom_frac,
            release_per_tick=self.release_per_tick, slo_boost=self.slo_boost,
            kv_saturation_frac=self.kv_saturation_frac, stale_after_s=self.demand_stale_s,
            burst_reserve_frac=self.burst_reserve_frac, burst_memory_s=self.burst_memory_s,
            lend_horizon_s=self.lend_horizon_s, lend_frac=self.lend_frac, slo_guard_frac=self.slo_guard_frac,
            reserve_z=self.reserve_z,
        )
