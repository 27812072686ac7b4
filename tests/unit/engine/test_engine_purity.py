"""services/sim/engine is a pure core: no I/O, no event loop, no wall clock."""

from __future__ import annotations

import ast
from pathlib import Path

from services.sim import engine

FORBIDDEN = {"asyncio", "time", "datetime", "aiohttp", "grpc", "redis", "httpx", "prometheus_client",
             "requests", "socket", "threading", "random"}


def test_engine_imports_nothing_impure() -> None:
    root = Path(engine.__file__).parent
    files = sorted(root.glob("*.py"))
    assert len(files) >= 6
    for path in files:
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                assert name.split(".")[0] not in FORBIDDEN, f"{path.name} imports {name}"
