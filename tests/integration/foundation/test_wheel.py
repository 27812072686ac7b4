"""`pip install .` ships `services` (with the simulator, services/sim) and the generated `tao`
package, nothing else: no generic top-level names (`sim`, `bench`), no extras. The wheel is
built here, unpacked, and run by an interpreter that sees only the unpacked wheel and the
runtime dependencies (``python -S``: no ``.pth`` files, so the editable install of this checkout
is invisible; the extras are blocked by an import hook). `tao serve router` then serves gRPC
health against a real Redis, and a checkout-only command says in one line why it cannot run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import time
import zipfile
from pathlib import Path

import pytest

from services.common.testing import free_port
from tests.unit.foundation.test_extras import BLOCKER

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def wheel_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                            "-q", "-w", str(out / "dist"), str(ROOT)],
                           capture_output=True, text=True, timeout=240, cwd=out)
    assert build.returncode == 0, build.stderr[-3000:]
    wheels = list((out / "dist").glob("*.whl"))
    assert len(wheels) == 1, wheels
    with zipfile.ZipFile(wheels[0]) as zf:
        zf.extractall(out / "site")
    return out


def test_the_wheel_holds_only_services_and_tao(wheel_dir: Path) -> None:
    top = {p.name for p in (wheel_dir / "site").iterdir() if not p.name.endswith(".dist-info")}
    assert top == {"services", "tao"}, top
    assert (wheel_dir / "site" / "services" / "sim" / "engine" / "engine.py").is_file()
    assert not (wheel_dir / "site" / "bench").exists()


def _run_wheel(wheel_dir: Path, code: str, **popen: object) -> subprocess.Popen[str]:
    deps = sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "PYTHON"))}
    env["PYTHONPATH"] = os.pathsep.join([str(wheel_dir / "site"), *dict.fromkeys(deps)])
    return subprocess.Popen([sys.executable, "-S", "-c", BLOCKER + code], cwd=wheel_dir, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **popen)  # type: ignore[call-overload]


def test_tao_serve_router_from_the_wheel_without_extras(wheel_dir: Path, redis_url: str) -> None:
    port = free_port()
    code = ("import services, sys\n"
            f"assert services.__file__.startswith({str(wheel_dir / 'site')!r}), services.__file__\n"
            "from services.cli import main\n"
            f"sys.exit(main(['serve', 'router', '--host', '127.0.0.1', '--port', '{port}', "
            f"'--http-port', '0', '--redis-url', {redis_url!r}]))\n")
    proc = _run_wheel(wheel_dir, code)
    try:
        health = [sys.executable, "-m", "services.cli", "health", f"127.0.0.1:{port}"]
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            if subprocess.run(health, capture_output=True, timeout=30, cwd=ROOT).returncode == 0:
                break
            assert time.monotonic() < deadline, "router from the wheel never became SERVING"
            time.sleep(0.5)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_checkout_only_commands_say_so_from_the_wheel(wheel_dir: Path) -> None:
    proc = _run_wheel(wheel_dir, "import sys\nfrom services.cli import main\nsys.exit(main(['check', 'faults']))\n")
    _, err = proc.communicate(timeout=120)
    lines = err.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, err[-2000:]
    assert "source checkout" in lines[0] and lines[0].startswith("tao check faults:")
