"""The services run without the optional extras; commands that need one say which, in one line.

Why not a real clean virtualenv: `pip install .` into a fresh venv needs PyPI (or a wheelhouse
built beforehand) for grpcio, numpy, pydantic, ... — CI may be offline, and on its two shared
cores a fresh install of the runtime dependencies takes minutes. Two cheaper checks together
prove the same thing, offline and in seconds:

* the metadata: pyproject's runtime ``dependencies`` do not name matplotlib / rich / hypothesis
  (so a plain install does not bring them), they are the ``report`` / ``faults`` extras, and
  services/common/extras.py agrees with pyproject;
* the code: a fresh interpreter of this venv with an import hook that makes matplotlib, rich
  and hypothesis unimportable (as in an install without the extras) imports every module of
  services/ and services/sim/ and the shipped bench commands, runs `tao serve <svc> --help` for the four
  services and `tao workload generate`, and gets the one-line error naming the extra from
  `tao up`, `tao sim run` and `tao check faults`.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from services.common.extras import DISTRIBUTIONS, EXTRAS, MissingExtra, extra_of, require

ROOT = Path(__file__).resolve().parents[3]
BLOCKED = sorted({m.split(".")[0] for modules in EXTRAS.values() for m in modules})

# Runs first in the child interpreter: matplotlib, rich and hypothesis cannot be imported.
BLOCKER = f"""
import sys
BLOCKED = {set(BLOCKED)!r}
class _Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}} (blocked by the test)", name=name)
        return None
sys.meta_path.insert(0, _Blocker())
assert not BLOCKED & {{m.split(".")[0] for m in sys.modules}}
"""

IMPORT_ALL = BLOCKER + """
import importlib, json, pkgutil
failed = []
def _try(name):
    try:
        importlib.import_module(name)
    except BaseException as exc:
        failed.append(f"{name}: {type(exc).__name__}: {exc}")
names = []
for pkg in ("services",):
    mod = importlib.import_module(pkg)
    for info in pkgutil.walk_packages(mod.__path__, pkg + ".", onerror=lambda n: failed.append(f"{n}: walk")):
        if not info.name.endswith("__main__"):
            names.append(info.name)
# the shipped commands that live in bench/ (services/cli.py COMMANDS)
names += ["bench.budget.cli", "bench.faults.cli"]
for name in names:
    _try(name)
leaked = sorted(BLOCKED & {m.split(".")[0] for m in sys.modules})
print(json.dumps({"imported": names, "failed": failed, "leaked": leaked}))
"""


def _tao(*argv: str, cwd: Path = ROOT, **env: str) -> subprocess.CompletedProcess[str]:
    code = BLOCKER + f"from services.cli import main\nsys.exit(main({list(argv)!r}))\n"
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=120,
                          env={**_env(), **env})


def _env() -> dict[str, str]:
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}  # tracing off unless a test asks
    return {**env, "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg"}


def test_pyproject_runtime_dependencies_exclude_the_extras() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

    def names(reqs: list[str]) -> set[str]:
        return {r.split(";")[0].split("[")[0].split("<")[0].split(">")[0].split("=")[0].strip().lower()
                for r in reqs}

    runtime = names(project["dependencies"])
    assert not runtime & set(BLOCKED), runtime & set(BLOCKED)
    extras = project["optional-dependencies"]
    for extra, modules in EXTRAS.items():
        assert names(extras[extra]) == set(DISTRIBUTIONS.get(extra, modules)), (extra, extras[extra])


def test_extras_helper() -> None:
    assert extra_of("matplotlib.pyplot") == "report" and extra_of("rich") == "report"
    assert extra_of("hypothesis.strategies") == "faults" and extra_of("numpy") is None and extra_of(None) is None
    assert extra_of("opentelemetry.sdk.trace") == "tracing"
    require("report", "x")  # this venv has every extra
    msg = str(MissingExtra("tao up", "report", "rich"))
    assert "\n" not in msg and "'report' extra" in msg and "tao-control-plane[report]" in msg


def test_every_shipped_module_imports_without_the_extras() -> None:
    out = subprocess.run([sys.executable, "-c", IMPORT_ALL], cwd=ROOT, capture_output=True, text=True,
                         timeout=240, env=_env())
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["failed"] == [], "\n".join(result["failed"])
    assert result["leaked"] == []
    servers = {f"services.{s}.server" for s in ("router", "planner", "predictor", "budget")}
    assert servers <= set(result["imported"])
    assert {"services.up.cli", "services.driver.cli", "services.sim.cluster.cli", "services.sim.cluster.plots"} <= set(result["imported"])


@pytest.mark.parametrize("service", ["router", "planner", "predictor", "budget"])
def test_tao_serve_help_without_the_extras(service: str) -> None:
    out = _tao("serve", service, "--help")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "--redis-url" in out.stdout
    if service == "router":
        assert "--replica" in out.stdout  # the router's own options: services.router.server imported


def test_commands_that_need_an_extra_say_so_in_one_line(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    gen = _tao("workload", "generate", "--kind", "swe-lite", "--sessions", "2", "--seed", "1", "-o", str(trace))
    assert gen.returncode == 0 and trace.exists(), gen.stderr[-2000:]
    cases = {
        ("up", "--report", str(tmp_path / "r")): "report",
        ("sim", "run", "--trace", str(trace), "--replicas", "1", "--policies", "tao"): "report",
        ("check", "faults", "--no-faults"): "faults",
    }
    for argv, extra in cases.items():
        out = _tao(*argv, cwd=tmp_path)
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 2, (argv, out.stderr[-2000:])
        assert len(lines) == 1 and f"'{extra}' extra" in lines[0] and "Traceback" not in out.stderr, (argv, lines)
    assert not (tmp_path / "r").exists()  # tao up stopped before starting anything


@pytest.mark.parametrize("service", ["router", "planner"])
def test_a_service_with_tracing_asked_for_but_no_extra_stops_in_one_line(service: str, tmp_path: Path) -> None:
    """OTEL_TRACES_EXPORTER switches tracing on; without the 'tracing' extra the service stops
    at start (before waiting for Redis) with one line naming the extra."""
    out = _tao("serve", service, "--port", "0", "--redis-url", "redis://127.0.0.1:9", cwd=tmp_path,
               OTEL_TRACES_EXPORTER="console")
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2, out.stderr[-2000:]
    assert len(lines) == 1 and "'tracing' extra" in lines[0] and "Traceback" not in out.stderr, lines
    assert lines[0].startswith(f"tao serve {service}:") and "tao-control-plane[tracing]" in lines[0]
