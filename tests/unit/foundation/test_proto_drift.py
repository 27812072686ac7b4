"""Committed generated code equals what scripts/gen_protos.py produces now."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def _files(base: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(base)): p.read_bytes()
        for p in sorted((base / "tao").rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


def test_generated_code_has_not_drifted(tmp_path: Path) -> None:
    subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_protos.py"), "--out", str(tmp_path)],
                   check=True, capture_output=True)
    fresh, committed = _files(tmp_path), _files(ROOT)
    assert sorted(fresh) == sorted(committed), "generated file set differs: run scripts/gen_protos.py"
    changed = [name for name in fresh if fresh[name] != committed[name]]
    assert changed == [], f"regenerate with scripts/gen_protos.py: {changed}"


def test_every_proto_is_versioned_and_documented() -> None:
    protos = sorted((ROOT / "protos").rglob("*.proto"))
    assert {p.parent.parent.name for p in protos} >= {"common", "planner", "predictor", "budget", "router"}
    for proto in protos:
        rel = proto.relative_to(ROOT / "protos")
        svc = rel.parts[1]
        text = proto.read_text()
        assert f"package tao.{svc}.v1;" in text, rel
        lines = text.splitlines()
        for i, line in enumerate(lines):
            stripped = line.strip()
            is_decl = stripped.startswith(("rpc ", "message ", "service ", "enum ")) or (
                stripped.endswith(";") and "=" in stripped and not stripped.startswith(("option", "syntax", "package"))
            )
            if is_decl:
                assert lines[i - 1].strip().startswith("//"), f"{rel}:{i + 1} undocumented: {stripped}"


def test_each_rpc_has_its_own_request_and_response() -> None:
    import re

    for proto in sorted((ROOT / "protos").rglob("*.proto")):
        rpcs = re.findall(r"rpc (\w+)\((?:stream )?(\w+)\) returns \((?:stream )?(\w+)\)", proto.read_text())
        for name, req, resp in rpcs:
            assert (req, resp) == (f"{name}Request", f"{name}Response"), f"{proto.name}: {name}"
