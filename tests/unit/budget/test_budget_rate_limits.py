"""Rate limits configured with the tenants: the budget carries each tenant's requests and tokens
per minute from ConfigureTenants, its settings and its CLI through its stored configuration (a
restarted service keeps them) into every allocation it publishes, which the routers read."""

from __future__ import annotations

import argparse

import pytest

from services.budget.convert import (
    BudgetAllocationRecord,
    allocation_to_proto,
    allocation_to_record,
    config_from_proto,
    config_from_record,
    config_to_record,
)
from services.budget.core import Allocation
from services.budget.settings import Settings, parse_tenant
from services.common.core.ratelimit import NO_LIMIT, RateLimit
from services.common.errors import InvalidArgument
from services.common.records import AllocationRecord, BudgetConfigRecord, load
from tao.budget.v1 import budget_pb2


def _request(*tenants: budget_pb2.TenantConfig) -> budget_pb2.ConfigureTenantsRequest:
    return budget_pb2.ConfigureTenantsRequest(total_budget=8, tenants=list(tenants))


def test_a_tenants_rate_limit_survives_proto_config_record_and_back() -> None:
    config = config_from_proto(_request(
        budget_pb2.TenantConfig(name="A", floor=1, rate_limit=budget_pb2.RateLimit(rpm=600, tpm=200_000)),
        budget_pb2.TenantConfig(name="B", rate_limit=budget_pb2.RateLimit(tpm=5_000)),
        budget_pb2.TenantConfig(name="C"),
    ))
    assert config.tenant("A").rate_limit == RateLimit(600, 200_000)
    assert config.tenant("C").rate_limit == NO_LIMIT
    assert config.rate_limits == {"A": RateLimit(600, 200_000), "B": RateLimit(0, 5_000)}  # C has none
    stored = load(BudgetConfigRecord, config_to_record(config, "dynamic", "e1", 3).model_dump_json())
    assert config_from_record(stored) == config


@pytest.mark.parametrize("limit", [budget_pb2.RateLimit(rpm=-1), budget_pb2.RateLimit(tpm=-5)])
def test_a_negative_rate_limit_is_an_invalid_argument(limit: budget_pb2.RateLimit) -> None:
    with pytest.raises(InvalidArgument, match="rate_limit.rpm and rate_limit.tpm must be >= 0"):
        config_from_proto(_request(budget_pb2.TenantConfig(name="A", rate_limit=limit)))


def test_every_allocation_carries_the_configured_rate_limits_to_the_routers() -> None:
    alloc = Allocation(4, 8, {"A": 4, "B": 4}, {"A": 4, "B": 4}, "static", 10.0)
    rec = allocation_to_record(alloc, "e1", 1_800_000_000.0, {"A": RateLimit(rpm=2)})
    # the routers read the shared AllocationRecord, not the budget's extended one
    seen = load(AllocationRecord, rec.model_dump_json())
    assert seen.rate_limits == {"A": RateLimit(rpm=2)}
    assert load(BudgetAllocationRecord, rec.model_dump_json()).rate_limits == {"A": RateLimit(rpm=2)}
    proto = allocation_to_proto(seen)
    assert dict(proto.rate_limits) == {"A": budget_pb2.RateLimit(rpm=2, tpm=0)}
    # an allocation stored before rate limits existed still loads, with none
    old = rec.model_dump(mode="json")
    del old["rate_limits"]
    assert AllocationRecord.model_validate(old).rate_limits == {}


def test_settings_and_the_cli_take_rpm_and_tpm() -> None:
    spec = parse_tenant("A:4:2:600:200000")
    assert (spec.name, spec.floor, spec.weight, spec.rpm, spec.tpm) == ("A", 4, 2.0, 600, 200_000)
    assert (parse_tenant("B::::5000").tpm, parse_tenant("B::::5000").floor, parse_tenant("B").rpm) == (5000, 0, 0)
    for bad in ("A:1:1:-3", "A:1:1:x", "A:1:1:1:1:1", ":1"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_tenant(bad)
    settings = Settings(total_budget=8, tenants=[parse_tenant("A:0:1:60"), parse_tenant("B")])
    config = settings.initial_config()
    assert config is not None and config.rate_limits == {"A": RateLimit(rpm=60)}
