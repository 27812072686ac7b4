from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from services.common.epoch import RevisionCounter, Stamp, StampFence
from services.common.errors import StartupError
from services.common.keys import OWNERS, owner_of
from services.common.records import PlanRecord, RecordError, dump, load
from services.common.settings import ServiceSettings, load_settings


class DemoSettings(ServiceSettings):
    service_name = "demo"
    model_config = ServiceSettings.model_config | {"env_prefix": "TAO_DEMO_"}


def test_precedence_override_env_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "demo.yaml"
    cfg.write_text("port: 7001\ngrace_s: 3\nlog_level: debug\n")
    monkeypatch.setenv("TAO_DEMO_PORT", "7002")
    s = load_settings(DemoSettings, config_file=cfg)
    assert (s.port, s.grace_s, s.log_level) == (7002, 3.0, "debug")
    s = load_settings(DemoSettings, config_file=cfg, port=7003)
    assert s.port == 7003


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        ({"port": -1}, "port"),
        ({"port": 70000}, "port"),
        ({"redis_url": "http://x"}, "redis_url"),
        ({"tls_cert_file": "/nonexistent.pem"}, "tls_cert_file and tls_key_file"),
        ({"log_level": "loud"}, "log_level"),
    ],
)
def test_bad_settings_give_one_clear_line(overrides: dict[str, Any], fragment: str) -> None:
    with pytest.raises(StartupError) as exc:
        load_settings(DemoSettings, **overrides)
    message = str(exc.value)
    assert "\n" not in message and fragment in message and message.startswith("invalid demo settings")


class ListSettings(ServiceSettings):
    service_name = "demo"
    model_config = ServiceSettings.model_config | {"env_prefix": "TAO_DEMO_"}
    names: list[str] = []


def test_a_list_setting_in_the_environment_that_is_not_json_is_one_clear_line(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TAO_DEMO_NAMES", '["a", "b"]')
    assert load_settings(ListSettings).names == ["a", "b"]
    monkeypatch.setenv("TAO_DEMO_NAMES", "a,b")
    with pytest.raises(StartupError) as exc:
        load_settings(ListSettings)
    message = str(exc.value)
    assert "\n" not in message and message.startswith("invalid demo settings") and '"names"' in message
    assert "are JSON" in message


def test_bad_config_file(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("- not a mapping\n")
    with pytest.raises(StartupError, match="must hold a mapping"):
        load_settings(DemoSettings, config_file=cfg)
    with pytest.raises(StartupError, match="cannot read config file"):
        load_settings(DemoSettings, config_file=tmp_path / "missing.yaml")


def test_fence_rejects_stale_epoch_and_old_revisions() -> None:
    writer = RevisionCounter("e1")
    fence = StampFence()
    s1, s2 = writer.next(), writer.next()
    assert fence.admits(s2, "e1")
    fence.mark(s2)
    assert not fence.admits(s1, "e1"), "older revision in the same epoch"
    restarted = RevisionCounter("e2")
    r1 = restarted.next()
    assert not fence.admits(Stamp("e1", 99), "e2"), "value from the dead writer epoch"
    assert fence.admits(r1, "e2"), "new live epoch starts over at 1"
    fence.mark(r1)
    assert not fence.admits(Stamp("e1", 100), None)


def test_key_owners_follow_prefixes() -> None:
    for key, owner in OWNERS.items():
        assert owner_of(key) == owner
    with pytest.raises(ValueError):
        owner_of("other:x")


def test_records_round_trip_and_reject_garbage() -> None:
    plan = PlanRecord(epoch="e", rev=3, policy="tao", solver="exact-dp", solve_ms=1.5,
                      snapshot_at_unix_s=1.0, created_at_unix_s=2.0)
    assert load(PlanRecord, dump(plan)) == plan
    with pytest.raises(RecordError):
        load(PlanRecord, '{"epoch": "e"}')
    with pytest.raises(RecordError):
        load(PlanRecord, None)
