"""No Docker engine runs here: validate the compose files against the compose-spec schema
(check-jsonschema's vendored copy) and check every command names a real `tao` subcommand."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from services.cli import COMMANDS

ROOT = Path(__file__).resolve().parents[3]
COMPOSE_FILES = ["docker-compose.yml", "docker-compose.real-vllm.yml"]


@pytest.mark.parametrize("name", COMPOSE_FILES)
def test_compose_file_matches_compose_spec(name: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.compose-spec", str(ROOT / name)],
        capture_output=True, text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _tao_invocations(command: list[str] | str) -> list[list[str]]:
    words = command if isinstance(command, list) else shlex.split(command)
    if words[:2] == ["sh", "-c"]:
        return [shlex.split(part) for part in words[2].split("&&") if shlex.split(part)[:1] == ["tao"]]
    return [words] if words[:1] == ["tao"] else []


def _known(words: list[str]) -> bool:
    args = words[1:]
    return any(tuple(args[: len(k)]) == k for k in COMMANDS)


def test_every_compose_command_is_a_real_tao_subcommand() -> None:
    checked = 0
    for name in COMPOSE_FILES:
        doc = yaml.safe_load((ROOT / name).read_text())
        for svc, spec in doc["services"].items():
            for key in ("command",):
                if key in spec:
                    for inv in _tao_invocations(spec[key]):
                        assert _known(inv), f"{name}:{svc}: {' '.join(inv)}"
                        checked += 1
            test = spec.get("healthcheck", {}).get("test")
            if isinstance(test, list) and test[:2] == ["CMD", "tao"]:
                assert _known(test[1:]), f"{name}:{svc} healthcheck"
                checked += 1
            if "healthcheck" in spec and "stop_grace_period" in spec:
                assert spec["stop_grace_period"] == "15s"
    assert checked >= 12


def test_services_wait_for_healthy_dependencies() -> None:
    doc = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    router = doc["services"]["router"]
    assert all(dep["condition"] == "service_healthy" for dep in router["depends_on"].values())
    assert {"redis", "planner", "predictor", "budget"} <= set(router["depends_on"])


def test_serve_subcommands_exist() -> None:
    from services.common.serve_cli import SERVICES

    doc = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    served = {spec["command"][2] for spec in doc["services"].values()
              if isinstance(spec.get("command"), list) and spec["command"][:2] == ["tao", "serve"]}
    assert served == set(SERVICES)
