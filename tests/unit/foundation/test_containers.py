"""No Docker engine runs here: validate the compose files against the compose-spec schema
(check-jsonschema's vendored copy) and check every command names a real `tao` subcommand."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

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


# --- two routers behind the gateway; the real-vLLM override -------------------------------------

NGINX_CONF = ROOT / "deploy" / "nginx" / "tao-router.conf"


def _merge(base: object, over: object) -> object:
    """Compose's merge of an override file for what these files use: mappings merge key by key,
    everything else is replaced."""
    if isinstance(base, dict) and isinstance(over, dict):
        return {k: _merge(base[k], over[k]) if k in base and k in over else over.get(k, base.get(k))
                for k in {**base, **over}}
    return over


def _merged_real_vllm() -> dict[str, Any]:
    base = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    override = yaml.safe_load((ROOT / "docker-compose.real-vllm.yml").read_text())
    merged = _merge(base, override)
    assert isinstance(merged, dict)
    return merged


def _active(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The services `docker compose up` starts (no profile)."""
    return {name: spec for name, spec in doc["services"].items() if not spec.get("profiles")}


def _routers(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: spec for name, spec in _active(doc).items() if spec.get("command", [])[:3] == ["tao", "serve", "router"]}


def _flag(command: list[str], flag: str) -> str:
    return command[command.index(flag) + 1]


def test_gateway_hashes_sessions_consistently_over_both_routers() -> None:
    doc = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    routers = _routers(doc)
    assert len(routers) >= 2
    conf = NGINX_CONF.read_text()
    assert re.search(r"^\s*hash \$tao_session_key consistent;", conf, re.M)
    # the key is the x-session-id header, else the id in /v1/sessions/{id}... (a release without the header)
    assert re.search(r"map \$http_x_session_id \$tao_session_key \{\s*\"\"\s+\$tao_session_in_path;\s*"
                     r"default\s+\$http_x_session_id;", conf)
    assert re.search(r"~\^/v1/sessions/\(\[\^/\]\+\)\s+\$1;", conf)
    servers = re.findall(r"^\s*server ([\w-]+):(\d+)\b", conf, re.M)
    assert sorted(servers) == sorted((name, _flag(spec["command"], "--http-port")) for name, spec in routers.items())
    for spec in routers.values():
        assert _flag(spec["command"], "--http-host") == "0.0.0.0"  # reachable from the gateway
        assert "ports" not in spec                                  # only the gateway is published
    gateway = doc["services"]["gateway"]
    assert gateway["ports"] == ["8080:8080"]
    assert re.search(r"^\s*listen 8080;", conf, re.M)
    source, target, _ = gateway["volumes"][0].split(":")
    assert (ROOT / source).resolve() == NGINX_CONF and target == "/etc/nginx/conf.d/default.conf"
    assert set(gateway["depends_on"]) == set(routers)
    assert "gateway:8080" in doc["services"]["agent"]["command"][2]


def test_real_vllm_override_starts_gpu_vllm_servers_the_routers_use(tmp_path: Path) -> None:
    merged = _merged_real_vllm()
    active = _active(merged)
    assert not {"vllm-0", "vllm-1"} & set(active)  # the emulated replicas stay down
    vllm = {name: spec for name, spec in active.items() if "vllm/vllm-openai" in spec.get("image", "")}
    assert len(vllm) >= 2
    devices_seen = []
    for name, spec in vllm.items():
        assert spec["entrypoint"] == ["vllm", "serve"] and "build" not in spec, name
        command = spec["command"]
        assert "--enable-prompt-tokens-details" in command and "--enable-prefix-caching" in command
        assert "--enable-scale-out" in command  # render endpoints for the router's KV-event credit (v0.30+)
        (kv,) = [a for a in command if a.startswith("--kv-events-config=")]
        config = json.loads(kv.split("=", 1)[1])
        assert config["enable_kv_cache_events"] is True and config["publisher"] == "zmq"
        (device,) = spec["deploy"]["resources"]["reservations"]["devices"]
        assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
        devices_seen.append(tuple(device["device_ids"]))
        assert "8000" in spec["expose"]
    assert len(set(devices_seen)) == len(devices_seen)  # each replica its own GPUs
    routers = _routers(merged)
    assert len(routers) >= 2
    for name, spec in routers.items():
        replicas = json.loads(spec["environment"]["TAO_ROUTER_REPLICAS"])
        assert replicas == [f"{v}=http://{v}:8000" for v in sorted(vllm)], name
        assert set(spec["depends_on"]) <= set(active), name
    for spec in active.values():
        assert set(spec.get("depends_on", {})) <= set(active)
    # the merged model is a valid compose file too
    path = tmp_path / "merged.yml"
    path.write_text(yaml.safe_dump(merged))
    result = subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.compose-spec", str(path)],
        capture_output=True, text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("name", COMPOSE_FILES)
def test_compose_files_name_no_foreign_addresses(name: str) -> None:
    text = (ROOT / name).read_text()
    addresses = set(re.findall(r"\b\d{1,3}(?:\.\d{1,3}){3}\b", text))
    assert addresses <= {"0.0.0.0", "127.0.0.1"}, addresses


@pytest.mark.skipif(shutil.which("nginx") is None, reason="nginx is not installed: the gateway config runs under it")
def test_gateway_config_keeps_each_session_on_one_router_under_nginx(tmp_path: Path) -> None:
    """The real nginx with deploy/nginx/tao-router.conf (router names replaced by two local HTTP
    servers that answer their own name; `resolve` dropped, which nginx < 1.27.3 lacks): every
    request of a session, its release by path without the header included, reaches one router,
    and sessions spread over both."""
    import http.server
    import threading
    import urllib.request
    from collections import Counter

    from services.common.testing import free_port

    servers = []
    for name in ("router", "router-2"):
        class Answer(http.server.BaseHTTPRequestHandler):
            me = name.encode()

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.send_response(200)
                self.send_header("Content-Length", str(len(self.me)))
                self.end_headers()
                self.wfile.write(self.me)

            def log_message(self, *args: object) -> None:
                pass

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Answer)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
    listen = free_port()
    conf = NGINX_CONF.read_text().replace(" resolve ", " ")
    conf = re.sub(r"^resolver .*$", "", conf, flags=re.M).replace("listen 8080;", f"listen 127.0.0.1:{listen};")
    for name, server in (("router-2", servers[1]), ("router", servers[0])):
        conf = conf.replace(f"server {name}:8080", f"server 127.0.0.1:{server.server_address[1]}")
    temp = "".join(f"{kind}_temp_path {tmp_path}/{kind};" for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    (tmp_path / "nginx.conf").write_text(
        f"daemon off; worker_processes 1; pid {tmp_path}/nginx.pid; error_log {tmp_path}/error.log;\n"
        f"events {{ worker_connections 64; }}\nhttp {{ access_log off; {temp}\n{conf}\n}}\n")
    proc = subprocess.Popen(["nginx", "-c", str(tmp_path / "nginx.conf"), "-p", str(tmp_path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        def post(path: str, session: str | None) -> str:
            request = urllib.request.Request(f"http://127.0.0.1:{listen}{path}", data=b"{}", method="POST")
            if session is not None:
                request.add_header("x-session-id", session)
            with urllib.request.urlopen(request, timeout=5) as reply:
                return str(reply.read().decode())

        deadline = time.monotonic() + 10
        while True:
            try:
                post("/v1/chat/completions", "probe")
                break
            except OSError:
                assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
                assert time.monotonic() < deadline, "nginx did not answer within 10 s"
                time.sleep(0.05)
        placed: Counter[str] = Counter()
        for i in range(60):
            sid = f"sess-{i}"
            first = post("/v1/chat/completions", sid)
            assert post("/v1/chat/completions", sid) == first
            assert post(f"/v1/sessions/{sid}/release", None) == first  # by path, no header
            placed[first] += 1
        assert set(placed) == {"router", "router-2"} and min(placed.values()) >= 10, placed
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        for server in servers:
            server.shutdown()


@pytest.mark.parametrize("model", ["docker-compose.yml", "merged with docker-compose.real-vllm.yml"])
def test_each_services_command_and_environment_load_into_its_settings(
        model: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every `tao serve` of the compose model parses as `tao serve` parses it and its flags and
    environment pass the service's settings validation; it listens where its health check and
    its clients look."""
    import argparse
    import importlib
    import os

    from services.common import serve_cli
    from services.router.settings import Settings as RouterSettings

    doc = yaml.safe_load((ROOT / "docker-compose.yml").read_text()) if model == "docker-compose.yml" \
        else _merged_real_vllm()
    active = _active(doc)
    loaded = 0
    for name, spec in active.items():
        command = spec.get("command", [])
        if command[:2] != ["tao", "serve"]:
            continue
        parser = argparse.ArgumentParser()
        serve_cli.add_arguments(parser)
        args = parser.parse_args(command[2:])
        for var in [k for k in os.environ if k.startswith("TAO_")]:
            monkeypatch.delenv(var)
        for var, value in spec.get("environment", {}).items():
            monkeypatch.setenv(var, str(value))
        settings = serve_cli.load_service_settings(importlib.import_module(f"services.{args.service}.server"), args)
        loaded += 1
        assert settings.host == "0.0.0.0" and settings.redis_url == "redis://redis:6379/0", name
        assert spec["healthcheck"]["test"][1:] == ["tao", "health", f"127.0.0.1:{settings.port}"], name
        if isinstance(settings, RouterSettings):
            assert settings.http_host == "0.0.0.0" and settings.http_port == 8080, name
            hosts = [url.split("//", 1)[1].split(":", 1)[0] for url in settings.replicas]
            assert hosts and set(hosts) <= set(active), (name, hosts)
            predictor_host, predictor_port = str(settings.predictor_address).rsplit(":", 1)
            assert _flag(active[predictor_host]["command"], "--port") == predictor_port, name
    assert loaded == 5  # planner, predictor, budget, two routers


def _kv_events_config(command: list[str]) -> dict[str, Any] | None:
    for i, word in enumerate(command):
        if word == "--kv-events-config":
            return dict(json.loads(command[i + 1]))
        if word.startswith("--kv-events-config="):
            return dict(json.loads(word.split("=", 1)[1]))
    return None


@pytest.mark.parametrize("model", ["docker-compose.yml", "merged with docker-compose.real-vllm.yml"])
def test_routers_subscribe_to_every_replicas_kv_events(model: str) -> None:
    """Each replica publishes KV events (and keeps a replay socket); every router names each
    replica by id and subscribes to exactly the sockets that replica binds, with its topic."""
    doc = yaml.safe_load((ROOT / "docker-compose.yml").read_text()) if model == "docker-compose.yml" \
        else _merged_real_vllm()
    active = _active(doc)
    routers = _routers(doc)
    for name, spec in routers.items():
        replicas = json.loads(spec["environment"]["TAO_ROUTER_REPLICAS"])
        ids = {r.split("=", 1)[0]: r.split("//", 1)[1].split(":", 1)[0] for r in replicas}
        sources = json.loads(spec["environment"]["TAO_ROUTER_KV_EVENTS"])
        assert set(sources) == set(ids), name
        for rid, source in sources.items():
            host = ids[rid]
            command = active[host]["command"]
            config = _kv_events_config(command)
            assert config is not None and config["enable_kv_cache_events"] is True, host
            if command[:2] == ["tao", "vllm-sim"]:  # the emulated replica takes the flag as vLLM does
                import argparse

                from services.sim.vllm_sim import cli as vllm_sim_cli

                parser = argparse.ArgumentParser()
                vllm_sim_cli.add_arguments(parser)
                parsed = parser.parse_args(command[2:]).kv_events_config
                assert (parsed.endpoint, parsed.replay_endpoint, parsed.topic) == \
                    (config["endpoint"], config["replay_endpoint"], config["topic"])
            expected = {key: "tcp://" + host + ":" + config[key].rsplit(":", 1)[1]
                        for key in ("endpoint", "replay_endpoint")}
            assert source == {**expected, "topic": config["topic"]}, (name, rid)


@pytest.mark.parametrize("model", ["docker-compose.yml", "merged with docker-compose.real-vllm.yml"])
def test_every_process_runs_at_the_same_time_scale(model: str) -> None:
    """Services, emulated replicas and the agent driver agree on model time (a driver that
    divides tool durations by 10 in front of real-time replicas plays another workload)."""
    doc = yaml.safe_load((ROOT / "docker-compose.yml").read_text()) if model == "docker-compose.yml" \
        else _merged_real_vllm()
    scales: dict[str, float] = {}
    for name, spec in doc["services"].items():
        if spec.get("profiles") and "agent" not in spec["profiles"]:
            continue
        command = spec.get("command", [])
        invocations = _tao_invocations(command)
        env = spec.get("environment", {})
        for words in invocations:
            if words[1:2] not in (["serve"], ["vllm-sim"], ["bench"]):
                continue
            default = env.get(f"TAO_{words[2].upper()}_TIME_SCALE", 1.0) if words[1] == "serve" else 1.0
            scale = _flag(words, "--time-scale") if "--time-scale" in words else default
            scales[f"{name}: {' '.join(words[:3])}"] = float(scale)
    assert any("bench" in k for k in scales) and len(set(scales.values())) == 1, scales
