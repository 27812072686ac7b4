"""Pure cores import no I/O and read no wall clock (STYLE: pure cores, thin adapters); the product
(services/, services/sim/) never imports its benchmarks (bench/)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PURE_DIRS = sorted(p for p in (ROOT / "services").glob("*/core") if p.is_dir()) + [ROOT / "services" / "sim" / "engine"]
FORBIDDEN_MODULES = {
    "grpc", "grpc_health", "grpc_reflection", "redis", "aiohttp", "httpx", "requests", "urllib3",
    "asyncio", "prometheus_client", "socket", "time", "datetime", "threading", "subprocess", "structlog",
}
FORBIDDEN_CALLS = {("time", "time"), ("time", "monotonic"), ("time", "perf_counter"), ("datetime", "now"),
                   ("datetime", "utcnow"), ("os", "environ"), ("os", "getenv")}


def _pure_files() -> list[Path]:
    return sorted(f for d in PURE_DIRS if d.exists() for f in d.rglob("*.py"))


def _violations(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in FORBIDDEN_MODULES:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {alias.name}")
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] in FORBIDDEN_MODULES:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} imports from {node.module}")
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if (node.value.id, node.attr) in FORBIDDEN_CALLS:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} uses {node.value.id}.{node.attr}")
    return found


def test_there_are_pure_cores_to_check() -> None:
    assert len(_pure_files()) >= 4


@pytest.mark.parametrize("path", _pure_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_pure_core_has_no_io_or_wall_clock(path: Path) -> None:
    assert _violations(path) == []


def test_checker_catches_a_violation(tmp_path: Path) -> None:
    bad = ROOT / "services" / "_probe_core_violation.py"
    bad.write_text("import asyncio\nimport time\nx = time.monotonic()\n")
    try:
        found = _violations(bad)
    finally:
        bad.unlink()
    assert len(found) == 3


# --- the product never imports its benchmarks -------------------------------------------------

PRODUCT_DIRS = [ROOT / "services"]
#: `tao` commands whose code lives in bench/ (dispatched by name from services/cli.py; they run
#: from a source checkout only, the wheel has no bench/); a known list that may only shrink
BENCH_COMMANDS = {("bench", "budget"), ("check", "faults")}


def _bench_imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and ((isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                   or (isinstance(node.func, ast.Name) and node.func.id in ("import_module", "__import__")))):
            names = [node.args[0].value]
        found += [f"{path.relative_to(ROOT)}:{node.lineno} imports {n}" for n in names if n.split(".")[0] == "bench"]
    return found


def test_services_and_sim_never_import_bench() -> None:
    files = sorted(f for d in PRODUCT_DIRS for f in d.rglob("*.py"))
    assert len(files) > 50
    assert [v for f in files for v in _bench_imports(f)] == []


def test_bench_import_checker_catches_each_form() -> None:
    bad = ROOT / "services" / "sim" / "_probe_bench_import.py"
    bad.write_text("import bench.e2e\nfrom bench.sim import grid\nimport importlib\n"
                   "importlib.import_module('bench.x')\nfrom benchmarks import y\n")
    try:
        found = _bench_imports(bad)
    finally:
        bad.unlink()
    assert len(found) == 3


def test_only_known_commands_dispatch_into_bench() -> None:
    from services.cli import COMMANDS

    into_bench = {words for words, (module, _) in COMMANDS.items() if module.split(".")[0] == "bench"}
    assert into_bench <= BENCH_COMMANDS, into_bench - BENCH_COMMANDS
    assert COMMANDS[("bench", "e2e")][0] == "services.driver.cli"
