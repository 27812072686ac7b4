"""The leader-lease core (services/common/core/lease.py): when to acquire and renew, and when a
holder must stop acting, on an injected clock."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.common.core.lease import Action, LeaseConfig, LeaseCore, Role, epoch_term, term_epoch


def test_config_defaults_and_validation() -> None:
    cfg = LeaseConfig(3.0)
    assert cfg.renew_interval_s == 1.0 and cfg.safety_margin_s == pytest.approx(0.3) and cfg.ttl_ms == 3000
    for bad in (dict(ttl_s=0.0), dict(ttl_s=math.nan), dict(ttl_s=1.0, renew_s=1.0), dict(ttl_s=1.0, safety_s=1.0),
                dict(ttl_s=1.0, renew_s=0.0)):
        with pytest.raises(ValueError):
            LeaseConfig(**bad)  # type: ignore[arg-type]


def test_standby_acquires_then_renews_and_stops_acting_before_the_key_can_expire() -> None:
    core = LeaseCore(LeaseConfig(3.0))
    assert core.due(0.0) is Action.ACQUIRE and not core.is_leader(0.0)
    core.acquired(7, sent_at=10.0)
    assert core.role is Role.LEADER and core.term == 7 and core.takeovers == 1
    assert core.due(10.5) is None and core.due(11.0) is Action.RENEW
    assert core.is_leader(12.6) and not core.is_leader(12.7)  # sent_at + ttl - 10 %
    core.renewed(sent_at=11.0)
    assert core.is_leader(13.6) and core.wait_s(11.0) == pytest.approx(1.0)


def test_unanswered_renewals_keep_the_lead_only_while_the_last_confirmation_holds() -> None:
    core = LeaseCore(LeaseConfig(3.0))
    core.acquired(1, sent_at=0.0)
    core.failed(1.0)
    assert core.role is Role.LEADER and core.due(1.25) is Action.RENEW  # retried soon
    core.failed(2.8)  # past 0 + 3 - 0.3
    assert core.role is Role.STANDBY and core.losses == 1 and core.due(3.05) is Action.ACQUIRE


def test_losing_the_key_steps_down_at_once_and_retries_acquiring_at_once() -> None:
    core = LeaseCore(LeaseConfig(3.0))
    core.acquired(1, sent_at=0.0)
    core.lost(0.5)
    assert not core.is_leader(0.5) and core.due(0.5) is Action.ACQUIRE and core.losses == 1
    core.not_acquired(sent_at=0.5)
    assert core.due(1.4) is None and core.due(1.5) is Action.ACQUIRE
    core.renewed(sent_at=1.6)  # a late renew answer after stepping down changes nothing
    assert not core.is_leader(1.6)


def test_term_epochs_increase_with_the_term_and_stay_unique_per_process() -> None:
    a, b = term_epoch(9, "aa"), term_epoch(10, "aa")
    assert a < b and epoch_term(a) == 9 and epoch_term(b) == 10
    assert term_epoch(1, "aa") != term_epoch(1, "bb")
    assert epoch_term("c60bfd4a8ea89aab") is None
    with pytest.raises(ValueError):
        term_epoch(0, "aa")


@given(st.lists(st.tuples(st.sampled_from(["acquired", "not", "renewed", "lost", "failed"]),
                          st.floats(0.0, 2.0)), max_size=40))
def test_a_holder_never_acts_past_its_last_confirmation_plus_ttl(steps: list[tuple[str, float]]) -> None:
    cfg = LeaseConfig(1.0)
    core = LeaseCore(cfg)
    now, confirmed = 0.0, -math.inf
    for what, dt in steps:
        now += dt
        if what == "acquired":
            core.acquired(core.term + 1, now)
            confirmed = now
        elif what == "not":
            core.not_acquired(now)
        elif what == "renewed":
            if core.role is Role.LEADER:
                confirmed = now
            core.renewed(now)
        elif what == "lost":
            core.lost(now)
        else:
            core.failed(now)
        for probe in (now, now + 0.5, now + 0.95):
            if core.is_leader(probe):
                assert probe < confirmed + cfg.ttl_s
