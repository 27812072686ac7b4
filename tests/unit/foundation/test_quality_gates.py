"""ruff over the whole tree and mypy (strict on every core package) as part of the test run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True)


def test_ruff_is_clean() -> None:
    result = _run("ruff", "check", "services", "bench", "tests", "scripts")
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_strict_on_cores_and_typed_common() -> None:
    # services/common/core is checked as part of services/common (naming it twice is a duplicate module)
    cores = [str(p.relative_to(ROOT)) for p in sorted((ROOT / "services").glob("*/core"))
             if any(p.glob("*.py")) and p.parent.name != "common"]
    result = _run("mypy", "--no-error-summary", *cores, "services/common", "services/sim/engine")
    assert result.returncode == 0, result.stdout + result.stderr
