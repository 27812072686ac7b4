"""Access: gRPC over TLS and mTLS with a bearer token (certificates made in the fixture);
health exempt from the token; Redis ACL user + password from settings."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import grpc
import pytest
import redis
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.common.bootstrap import ServiceContext
from services.common.certs import CertSet, make_cert_set
from services.common.channels import make_channel
from services.common.settings import ServiceSettings, load_settings
from services.common.testing import RedisServer, serve_in_process


class S(ServiceSettings):
    service_name = "echo"


class Echo:
    grpc_service_names: Sequence[str] = ("tao.test.Echo",)

    async def start(self, server: grpc.aio.Server, ctx: ServiceContext) -> None:
        async def echo(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            return request

        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
            "tao.test.Echo", {"Echo": grpc.unary_unary_rpc_method_handler(echo)}),))

    async def stop(self) -> None:
        return None


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> CertSet:
    return make_cert_set(tmp_path_factory.mktemp("certs"))


async def _call(channel: grpc.aio.Channel) -> bytes:
    return await channel.unary_unary("/tao.test.Echo/Echo")(b"ping", timeout=5)


async def _health(channel: grpc.aio.Channel) -> int:
    reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    return int(reply.status)


async def test_tls_with_token(redis_url: str, certs: CertSet) -> None:
    settings = load_settings(S, redis_url=redis_url, port=0, tls_cert_file=certs.server_cert,
                             tls_key_file=certs.server_key, auth_token="tok")
    async with serve_in_process("echo", Echo(), settings, wait_serving=False) as running:
        target = f"localhost:{running.port}"
        async with make_channel(target, ca_file=certs.ca, token="tok") as ch:
            assert await _call(ch) == b"ping"
        async with make_channel(target, ca_file=certs.ca) as ch:
            assert await _health(ch) in (health_pb2.HealthCheckResponse.SERVING,
                                         health_pb2.HealthCheckResponse.NOT_SERVING)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await _call(ch)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        async with grpc.aio.insecure_channel(target) as ch:  # plaintext to a TLS port fails
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await _call(ch)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_mtls_requires_client_certificate(redis_url: str, certs: CertSet) -> None:
    settings = load_settings(S, redis_url=redis_url, port=0, tls_cert_file=certs.server_cert,
                             tls_key_file=certs.server_key, tls_client_ca_file=certs.ca)
    async with serve_in_process("echo", Echo(), settings, wait_serving=False) as running:
        target = f"localhost:{running.port}"
        async with make_channel(target, ca_file=certs.ca, cert_file=certs.client_cert,
                                key_file=certs.client_key) as ch:
            assert await _call(ch) == b"ping"
        async with make_channel(target, ca_file=certs.ca) as ch:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await _call(ch)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_redis_acl_user_and_password(tmp_path: Path) -> None:
    from services.common.testing import find_redis_binary

    binary = find_redis_binary()
    if binary is None:
        pytest.skip("needs a redis-server binary")
    server = RedisServer(binary, password="adminpw")
    server.start()
    try:
        admin = redis.Redis(host="127.0.0.1", port=server.port, password="adminpw")
        admin.execute_command("ACL", "SETUSER", "tao", "on", ">taopw", "~tao:*", "&*", "+@all")
        admin.close()
        url = f"redis://127.0.0.1:{server.port}/0"
        good = load_settings(S, redis_url=url, port=0, redis_username="tao", redis_password="taopw")
        async with serve_in_process("echo", Echo(), good) as running:
            await running.ctx.redis.set("tao:echo:x", "1")
            with pytest.raises(redis.exceptions.NoPermissionError):
                await running.ctx.redis.set("other:x", "1")
        from services.common.bootstrap import start_service
        from services.common.errors import StartupError

        bad = load_settings(S, redis_url=url, port=0, redis_username="tao", redis_password="wrong",
                            redis_startup_timeout_s=0.3)
        with pytest.raises(StartupError, match="cannot reach Redis"):
            await start_service("echo", Echo(), bad)
    finally:
        server.stop()
