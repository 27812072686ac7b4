"""deploy/kubernetes: each overlay renders with `kubectl kustomize`, every object validates against
the Kubernetes 1.30 OpenAPI schemas (kubernetes-validate, strict: unknown fields fail), and the
deployment's invariants hold: at least two routers and an HPA on them, both probes on every
container, a PDB per Deployment, every Secret / ConfigMap reference resolvable, every TAO
setting a real setting of its service, the router's replicas the pods the overlay runs."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from services.cli import COMMANDS
from services.common.serve_cli import SERVICES

ROOT = Path(__file__).resolve().parents[3]
KUBE = ROOT / "deploy" / "kubernetes"
K8S_VERSION = "1.30.0"  # the oldest Kubernetes the manifests are written for (grpc probes: GA in 1.27)
OVERLAYS = ["emulated", "vllm"]
# files the vllm overlay's secretGenerator reads; the operator writes them (overlays/vllm/secrets/README.md)
VLLM_SECRET_FILES = ["auth-token", "admin-token", "redis-password", "keys.yaml", "grpc-tls.crt", "grpc-tls.key",
                     "grpc-ca.crt", "ingress-tls.crt", "ingress-tls.key"]
SERVICE_PORTS = {"router": 50051, "planner": 50052, "predictor": 50053, "budget": 50054}

Obj = dict[str, Any]

pytestmark = pytest.mark.skipif(shutil.which("kubectl") is None,
                                reason="kubectl is not installed: `kubectl kustomize` renders the overlays")


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Obj]]:
    tree = tmp_path_factory.mktemp("kube") / "kubernetes"
    shutil.copytree(KUBE, tree)
    secrets = tree / "overlays" / "vllm" / "secrets"
    for name in VLLM_SECRET_FILES:
        (secrets / name).write_text("keys: []\n" if name == "keys.yaml" else f"test-{name}")
    out = {}
    for overlay in OVERLAYS:
        result = subprocess.run(["kubectl", "kustomize", str(tree / "overlays" / overlay)],
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        out[overlay] = [doc for doc in yaml.safe_load_all(result.stdout) if doc]
    return out


def _of(objs: list[Obj], kind: str) -> dict[str, Obj]:
    return {o["metadata"]["name"]: o for o in objs if o["kind"] == kind}


def _workloads(objs: list[Obj]) -> Iterator[Obj]:
    yield from (o for o in objs if o["kind"] in ("Deployment", "StatefulSet"))


def _containers(workload: Obj) -> list[Obj]:
    return list(workload["spec"]["template"]["spec"]["containers"])


def _tao_service(workload: Obj) -> str | None:
    """`router` for the Deployment running `tao serve router`, ..., else None."""
    command = _containers(workload)[0].get("command", [])
    return command[2] if command[:2] == ["tao", "serve"] else None


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_validates_against_the_kubernetes_schema(rendered: dict[str, list[Obj]], overlay: str) -> None:
    import kubernetes_validate

    objs = rendered[overlay]
    assert len(objs) >= 20
    for obj in objs:
        try:
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{overlay}: {obj['kind']}/{obj['metadata']['name']}: {exc.message} at {list(exc.path)}")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_routers_scale_out_behind_an_hpa(rendered: dict[str, list[Obj]], overlay: str) -> None:
    objs = rendered[overlay]
    router = _of(objs, "Deployment")["tao-router"]
    assert router["spec"]["replicas"] >= 2
    (hpa,) = _of(objs, "HorizontalPodAutoscaler").values()
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "tao-router"}
    assert 2 <= hpa["spec"]["minReplicas"] <= router["spec"]["replicas"] <= hpa["spec"]["maxReplicas"]
    # the predictor is its keys' single writer: never two at once (one writer per key family)
    predictor = _of(objs, "Deployment")["tao-predictor"]
    assert predictor["spec"]["replicas"] == 1 and predictor["spec"]["strategy"]["type"] == "Recreate"
    # planner and budget run active/standby under a Redis lease: a standby up before the old pod goes
    for name in ("tao-planner", "tao-budget"):
        dep = _of(objs, "Deployment")[name]
        assert dep["spec"]["replicas"] >= 2, name
        assert dep["spec"]["strategy"]["rollingUpdate"] == {"maxUnavailable": 0, "maxSurge": 1}, name
        (c,) = _containers(dep)
        svc = name.removeprefix("tao-").upper()
        assert _pod_env(objs, c).get(f"TAO_{svc}_LEADER_ELECTION", "true") == "true", name


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_deployment_has_both_probes_and_a_pdb(rendered: dict[str, list[Obj]], overlay: str) -> None:
    objs = rendered[overlay]
    pdbs = list(_of(objs, "PodDisruptionBudget").values())
    deployments = _of(objs, "Deployment")
    assert {_tao_service(d) for d in deployments.values()} == set(SERVICES)
    for name, dep in deployments.items():
        labels = dep["spec"]["template"]["metadata"]["labels"]
        assert dep["spec"]["selector"]["matchLabels"].items() <= labels.items()
        covering = [p for p in pdbs if p["spec"]["selector"]["matchLabels"].items() <= labels.items()]
        assert len(covering) == 1, f"{overlay}: {name} has {len(covering)} PDBs"
    for wl in _workloads(objs):
        for c in _containers(wl):
            assert "readinessProbe" in c and "livenessProbe" in c, f"{overlay}: {wl['metadata']['name']}/{c['name']}"


def _probe_target(probe: Obj) -> tuple[int, str] | None:
    """(port, gRPC health service) a probe asks, natively or through `tao health`; None for others."""
    if "grpc" in probe:
        return int(probe["grpc"]["port"]), probe["grpc"].get("service", "")
    command = probe.get("exec", {}).get("command", [])
    if command[:2] == ["tao", "health"]:
        service = command[command.index("--service") + 1] if "--service" in command else ""
        return int(command[2].rsplit(":", 1)[1]), service
    return None


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_probes_ask_the_services_own_grpc_health(rendered: dict[str, list[Obj]], overlay: str) -> None:
    from services.common.bootstrap import LIVENESS_SERVICE

    for dep in _of(rendered[overlay], "Deployment").values():
        svc = _tao_service(dep)
        assert svc is not None
        (c,) = _containers(dep)
        port = SERVICE_PORTS[svc]
        assert port in {p["containerPort"] for p in c["ports"]}
        # liveness: the name that stays SERVING through a Redis outage
        assert _probe_target(c["livenessProbe"]) == (port, LIVENESS_SERVICE)
        if svc == "router":  # in the Service while a replica takes requests (the HTTP gateway's /health)
            assert c["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
        else:
            assert _probe_target(c["readinessProbe"]) == (port, "")
        if overlay == "emulated":  # plaintext gRPC: the kubelet's native probe
            assert "grpc" in c["livenessProbe"]


def _config_maps(objs: list[Obj]) -> dict[str, dict[str, str]]:
    return {name: cm.get("data", {}) for name, cm in _of(objs, "ConfigMap").items()}


def _secret_keys(objs: list[Obj]) -> dict[str, set[str]]:
    return {name: set(s.get("data", {})) | set(s.get("stringData", {})) for name, s in _of(objs, "Secret").items()}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_secret_and_config_reference_exists(rendered: dict[str, list[Obj]], overlay: str) -> None:
    objs = rendered[overlay]
    secrets, config_maps = _secret_keys(objs), _config_maps(objs)
    checked = 0
    for wl in _workloads(objs):
        where = f"{overlay}: {wl['metadata']['name']}"
        pod = wl["spec"]["template"]["spec"]
        for c in _containers(wl):
            for env in c.get("env", []):
                ref = env.get("valueFrom", {})
                if "secretKeyRef" in ref:
                    name, key = ref["secretKeyRef"]["name"], ref["secretKeyRef"]["key"]
                    assert key in secrets.get(name, set()), f"{where}: {env['name']} -> secret {name}/{key}"
                    checked += 1
                if "configMapKeyRef" in ref:
                    name, key = ref["configMapKeyRef"]["name"], ref["configMapKeyRef"]["key"]
                    assert key in config_maps.get(name, {}), f"{where}: {env['name']} -> configmap {name}/{key}"
            for source in c.get("envFrom", []):
                if "configMapRef" in source:
                    assert source["configMapRef"]["name"] in config_maps, where
                if "secretRef" in source:
                    assert source["secretRef"]["name"] in secrets, where
        for volume in pod.get("volumes", []):
            if "secret" in volume:
                assert volume["secret"]["secretName"] in secrets, f"{where}: volume {volume['name']}"
                checked += 1
    for ing in _of(objs, "Ingress").values():
        for tls in ing["spec"].get("tls", []):
            assert {"tls.crt", "tls.key"} <= secrets[tls["secretName"]]
    assert checked >= 13


#: what the kubelet puts in for a downward-API fieldRef, for one pod
POD_FIELDS = {"metadata.name": "tao-router-7d9f-x2k4p", "status.podIP": "10.1.2.3"}


def _pod_env(objs: list[Obj], container: Obj) -> dict[str, str]:
    """The container's environment as the kubelet builds it (Secret values shown as <secret>,
    downward-API fields from ``POD_FIELDS``, ``$(NAME)`` of an earlier variable expanded)."""
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        env.update(_config_maps(objs)[source["configMapRef"]["name"]])
    for e in container.get("env", []):
        if "value" in e:
            env[e["name"]] = re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                                    lambda m: env.get(m.group(1), m.group(0)), e["value"])
        elif "fieldRef" in e.get("valueFrom", {}):
            env[e["name"]] = POD_FIELDS[e["valueFrom"]["fieldRef"]["fieldPath"]]
        else:
            env[e["name"]] = "<secret>"
    return env


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_tao_setting_is_a_real_setting(rendered: dict[str, list[Obj]], overlay: str) -> None:
    import importlib

    objs = rendered[overlay]
    for dep in _of(objs, "Deployment").values():
        svc = _tao_service(dep)
        assert svc is not None
        (c,) = _containers(dep)
        fields = importlib.import_module(f"services.{svc}.server").Settings.model_fields
        env = _pod_env(objs, c)
        own = {k: v for k, v in env.items() if k.startswith(f"TAO_{svc.upper()}_")}
        assert len(own) >= 7, f"{overlay}: {svc} has {sorted(own)}"
        for name in own:
            assert name.removeprefix(f"TAO_{svc.upper()}_").lower() in fields, f"{overlay}: {svc}: {name}"
        assert own[f"TAO_{svc.upper()}_HOST"] == "0.0.0.0"
        assert int(own[f"TAO_{svc.upper()}_PORT"]) == SERVICE_PORTS[svc]
        assert own[f"TAO_{svc.upper()}_REDIS_PASSWORD"] == "<secret>"
        for key in ("TLS_CERT_FILE", "TLS_KEY_FILE", "API_KEYS_FILE"):
            path = own.get(f"TAO_{svc.upper()}_{key}")
            if path is not None:  # the file is a key of a Secret mounted at its folder
                _assert_mounted_secret_file(objs, dep, c, path)


def _assert_mounted_secret_file(objs: list[Obj], dep: Obj, container: Obj, path: str) -> None:
    folder, file = path.rsplit("/", 1)
    volumes = {v["name"]: v for v in dep["spec"]["template"]["spec"]["volumes"]}
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == folder]
    secret = volumes[mount["name"]]["secret"]["secretName"]
    assert file in _secret_keys(objs)[secret], f"{path}: no key {file} in secret {secret}"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_router_replicas_are_the_pods_the_overlay_runs(rendered: dict[str, list[Obj]], overlay: str) -> None:
    objs = rendered[overlay]
    (c,) = _containers(_of(objs, "Deployment")["tao-router"])
    replicas = json.loads(_pod_env(objs, c)["TAO_ROUTER_REPLICAS"])
    vllm = _of(objs, "StatefulSet")["vllm"]
    headless = _of(objs, "Service")[vllm["spec"]["serviceName"]]
    assert headless["spec"]["clusterIP"] == "None" and headless["spec"]["publishNotReadyAddresses"] is True
    ports = {p["name"]: p["port"] for p in headless["spec"]["ports"]}
    pods = [f"vllm-{i}" for i in range(vllm["spec"]["replicas"])]
    host = {pod: f"{pod}.{headless['metadata']['name']}" for pod in pods}
    assert replicas == [f"{pod}=http://{host[pod]}:{ports['http']}" for pod in pods]
    # every replica's KV-event publisher and replay socket, as its --kv-events-config binds them
    (c_vllm,) = _containers(vllm)
    words = [*c_vllm.get("command", []), *c_vllm.get("args", [])]
    (published,) = [json.loads(w.split("=", 1)[1] if w.startswith("--kv-events-config=") else words[i + 1])
                    for i, w in enumerate(words) if w.split("=", 1)[0] == "--kv-events-config"]
    kv_events = json.loads(_pod_env(objs, c)["TAO_ROUTER_KV_EVENTS"])
    assert set(kv_events) == set(pods)
    pub_port, replay_port = (int(published[k].rsplit(":", 1)[1]) for k in ("endpoint", "replay_endpoint"))
    assert {pub_port, replay_port} <= set(ports.values()) <= {p["containerPort"] for p in c_vllm["ports"]}
    for pod, source in kv_events.items():
        assert source == {"endpoint": f"tcp://{host[pod]}:{pub_port}", "replay_endpoint": f"tcp://{host[pod]}:{replay_port}",
                          "topic": published["topic"]}
    policy = next(p for p in _of(objs, "NetworkPolicy").values()
                  if p["spec"]["podSelector"]["matchLabels"] == vllm["spec"]["selector"]["matchLabels"])
    assert {r["port"] for r in policy["spec"]["ingress"][0]["ports"]} == set(ports.values())


def test_vllm_servers_have_what_tao_needs(rendered: dict[str, list[Obj]]) -> None:
    objs = rendered["vllm"]
    vllm = _of(objs, "StatefulSet")["vllm"]
    (c,) = _containers(vllm)
    assert c["image"].startswith("vllm/vllm-openai:") and c["command"] == ["vllm", "serve"]
    args = c["args"]
    assert "--enable-prompt-tokens-details" in args and "--enable-prefix-caching" in args
    assert "--enable-scale-out" in args  # the render endpoints the router's KV-event credit uses (v0.30+)
    (kv,) = [a for a in args if a.startswith("--kv-events-config=")]
    kv_config = json.loads(kv.split("=", 1)[1])
    assert kv_config["enable_kv_cache_events"] is True and kv_config["publisher"] == "zmq"
    kv_port = int(kv_config["endpoint"].rsplit(":", 1)[1])
    assert kv_port in {p["containerPort"] for p in c["ports"]}
    gpus = c["resources"]["requests"]["nvidia.com/gpu"]
    assert gpus == c["resources"]["limits"]["nvidia.com/gpu"] >= 1
    tp = _of(objs, "ConfigMap")["vllm-config"]["data"]["TENSOR_PARALLEL_SIZE"]
    assert int(tp) == gpus and "--tensor-parallel-size=$(TENSOR_PARALLEL_SIZE)" in args
    assert "startupProbe" in c  # model loading takes minutes: liveness waits for it


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_pods_run_unprivileged_with_requests(rendered: dict[str, list[Obj]], overlay: str) -> None:
    for wl in _workloads(rendered[overlay]):
        where = f"{overlay}: {wl['metadata']['name']}"
        pod = wl["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True, where
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, where
        assert pod["automountServiceAccountToken"] is False, where
        for c in _containers(wl):
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"], where
            assert {"cpu", "memory"} <= set(c["resources"]["requests"]), where
            if not c["image"].startswith("vllm/"):  # vLLM writes caches all over its image
                assert sc["readOnlyRootFilesystem"] is True, where


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_commands_name_real_tao_subcommands_and_services_name_real_ports(
        rendered: dict[str, list[Obj]], overlay: str) -> None:
    objs = rendered[overlay]
    ports_by_app: dict[str, set[str | int]] = {}
    for wl in _workloads(objs):
        labels = wl["spec"]["template"]["metadata"]["labels"]
        for c in _containers(wl):
            command = c.get("command", [])
            if command[:1] == ["tao"]:
                assert any(tuple(command[1:1 + len(k)]) == k for k in COMMANDS), " ".join(command)
            ports_by_app.setdefault(labels["app.kubernetes.io/name"], set()).update(
                x for p in c.get("ports", []) for x in (p.get("name"), p["containerPort"]))
    for name, svc in _of(objs, "Service").items():
        app = svc["spec"]["selector"]["app.kubernetes.io/name"]
        for port in svc["spec"]["ports"]:
            assert port["targetPort"] in ports_by_app[app], f"{overlay}: service {name} port {port}"


def test_secret_material_is_never_committed() -> None:
    ignore = (KUBE / "overlays" / "vllm" / "secrets" / ".gitignore").read_text()
    assert re.search(r"^\*$", ignore, re.M)
    tracked = subprocess.run(["git", "ls-files", str(KUBE / "overlays" / "vllm" / "secrets")], cwd=ROOT,
                             capture_output=True, text=True).stdout.split()
    assert all(Path(p).name in (".gitignore", "README.md") for p in tracked), tracked


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_pods_environment_loads_into_its_services_settings(
        rendered: dict[str, list[Obj]], overlay: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The environment the kubelet gives each TAO container (ConfigMap, Secret values, mounted
    files moved under tmp_path) passes the service's own settings validation."""
    import base64
    import importlib
    import os

    from services.common.settings import load_settings

    objs = rendered[overlay]
    secrets = {name: {k: base64.b64decode(v).decode() for k, v in s.get("data", {}).items()}
               for name, s in _of(objs, "Secret").items()}
    for dep in _of(objs, "Deployment").values():
        svc = _tao_service(dep)
        assert svc is not None
        (c,) = _containers(dep)
        volumes = {v["name"]: v for v in dep["spec"]["template"]["spec"]["volumes"]}
        mounts: dict[str, Path] = {}
        for mount in c["volumeMounts"]:
            secret = volumes[mount["name"]].get("secret")
            if secret is not None:  # the Secret's keys as files, as the kubelet mounts them
                folder = tmp_path / svc / mount["name"]
                folder.mkdir(parents=True)
                for key, value in secrets[secret["secretName"]].items():
                    (folder / key).write_text(value)
                mounts[mount["mountPath"]] = folder
        for name in [k for k in os.environ if k.startswith("TAO_")]:
            monkeypatch.delenv(name)
        given: dict[str, str] = {}
        for name, value in _pod_env(objs, c).items():
            for e in c.get("env", []):
                if e["name"] == name and "secretKeyRef" in e.get("valueFrom", {}):
                    ref = e["valueFrom"]["secretKeyRef"]
                    value = secrets[ref["name"]][ref["key"]]
            for mount_path, folder in mounts.items():
                if value.startswith(mount_path + "/"):
                    value = str(folder / value.removeprefix(mount_path + "/"))
            monkeypatch.setenv(name, value)
            given[name] = value
        module = importlib.import_module(f"services.{svc}.server")
        settings = load_settings(module.Settings)
        assert settings.port == SERVICE_PORTS[svc] and settings.host == "0.0.0.0"
        assert settings.redis_password is not None and settings.auth_token is not None
        assert settings.admin_secret() == given[f"TAO_{svc.upper()}_ADMIN_TOKEN"] != given[f"TAO_{svc.upper()}_AUTH_TOKEN"]
        assert (settings.tls_cert_file is not None) == (overlay == "vllm")
        if svc == "router":
            assert settings.http_host == "0.0.0.0" and settings.api_keys_file is not None
            # its tool events reach the predictor's Service, over TLS when the predictor speaks it
            host, port = str(settings.predictor_address).rsplit(":", 1)
            predictor = _of(objs, "Service")[host]
            assert int(port) in {p["port"] for p in predictor["spec"]["ports"]} and int(port) == SERVICE_PORTS["predictor"]
            assert (settings.predictor_ca_file is not None) == (overlay == "vllm")
            assert len(settings.replicas) == _of(objs, "StatefulSet")["vllm"]["spec"]["replicas"]
            # one fleet: every pod a member under its own name, reached by the others at its IP
            assert settings.fleet and settings.router_id == POD_FIELDS["metadata.name"]
            assert settings.advertise_url == f"http://{POD_FIELDS['status.podIP']}:{settings.http_port}"


def test_ingress_hashes_sessions_onto_router_pods(rendered: dict[str, list[Obj]]) -> None:
    objs = rendered["vllm"]
    (ingress,) = _of(objs, "Ingress").values()
    annotations = ingress["metadata"]["annotations"]
    assert annotations["nginx.ingress.kubernetes.io/upstream-hash-by"] == "$http_x_session_id"
    assert annotations["nginx.ingress.kubernetes.io/proxy-buffering"] == "off"  # token streams
    assert int(annotations["nginx.ingress.kubernetes.io/proxy-read-timeout"]) >= 600  # held requests
    (rule,) = ingress["spec"]["rules"]
    (path,) = rule["http"]["paths"]
    assert path["backend"]["service"] == {"name": "tao-router", "port": {"name": "http"}}
    assert {"name": "http", "port": 8080, "targetPort": "http"} in _of(objs, "Service")["tao-router"]["spec"]["ports"]
