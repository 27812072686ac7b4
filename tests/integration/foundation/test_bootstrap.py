"""The shared bootstrap over real gRPC and a real Redis: health follows Redis, auth, metrics,
reflection, graceful stop."""

from __future__ import annotations

from collections.abc import Sequence

import aiohttp
import grpc
import pytest
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from services.common.bootstrap import LIVENESS_SERVICE, ServiceContext, start_service
from services.common.errors import InvalidArgument, StartupError
from services.common.settings import ServiceSettings, load_settings
from services.common.testing import RedisServer, health_status, serve_in_process, wait_until_serving


class EchoSettings(ServiceSettings):
    service_name = "echo"


class EchoApp:
    """Raw-bytes echo service; 'bad' raises a domain error."""

    grpc_service_names: Sequence[str] = ("tao.test.Echo",)

    def __init__(self) -> None:
        self.stopped = False

    async def start(self, server: grpc.aio.Server, ctx: ServiceContext) -> None:
        async def echo(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            if request == b"bad":
                raise InvalidArgument("bad payload")
            return request

        handler = grpc.method_handlers_generic_handler(
            "tao.test.Echo", {"Echo": grpc.unary_unary_rpc_method_handler(echo)}
        )
        server.add_generic_rpc_handlers((handler,))

    async def stop(self) -> None:
        self.stopped = True


def _settings(redis_url: str, **kw: object) -> EchoSettings:
    values: dict[str, object] = {"port": 0, "redis_startup_timeout_s": 2.0, **kw}
    return load_settings(EchoSettings, redis_url=redis_url, **values)


async def _echo(address: str, payload: bytes, token: str | None = None) -> bytes:
    async with grpc.aio.insecure_channel(address) as channel:
        call = channel.unary_unary("/tao.test.Echo/Echo")
        md = (("authorization", f"Bearer {token}"),) if token else None
        return await call(payload, metadata=md, timeout=5)


async def test_serving_echo_errors_metrics_and_reflection(redis_url: str) -> None:
    app = EchoApp()
    async with serve_in_process("echo", app, _settings(redis_url, metrics_port=0)) as running:
        assert await _echo(running.address, b"hi") == b"hi"
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await _echo(running.address, b"bad")
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "bad payload" in (err.value.details() or "")
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{running.metrics_port}/metrics") as resp:
                text = await resp.text()
        assert 'grpc_server_handled_total{grpc_code="OK",grpc_method="Echo"' in text
        assert 'grpc_code="INVALID_ARGUMENT"' in text and "grpc_server_handling_seconds_bucket" in text
        async with grpc.aio.insecure_channel(running.address) as channel:
            stub = reflection_pb2_grpc.ServerReflectionStub(channel)
            replies = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
            names = [s.name async for r in replies for s in r.list_services_response.service]
        assert "tao.test.Echo" in names and "grpc.health.v1.Health" in names
    assert app.stopped


async def test_bearer_token_required_but_health_exempt(redis_url: str) -> None:
    async with serve_in_process("echo", EchoApp(), _settings(redis_url, auth_token="s3cret")) as running:
        assert await health_status(running.address) == "SERVING"
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await _echo(running.address, b"x")
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.aio.AioRpcError):
            await _echo(running.address, b"x", token="wrong")
        assert await _echo(running.address, b"x", token="s3cret") == b"x"


async def test_health_follows_redis(redis_proc: RedisServer) -> None:
    async with serve_in_process("echo", EchoApp(), _settings(redis_proc.url)) as running:
        assert await health_status(running.address, "tao.test.Echo") == "SERVING"
        redis_proc.kill()
        for _ in range(60):
            if await health_status(running.address) == "NOT_SERVING":
                break
            import asyncio

            await asyncio.sleep(0.1)
        assert await health_status(running.address) == "NOT_SERVING"
        # the liveness name stays SERVING: an outage of Redis must not restart pods (deploy/kubernetes)
        assert await health_status(running.address, LIVENESS_SERVICE) == "SERVING"
        redis_proc.start()
        await wait_until_serving(running.address, timeout_s=15)


async def test_unreachable_redis_is_a_one_line_startup_error() -> None:
    settings = load_settings(EchoSettings, redis_url="redis://127.0.0.1:1/0", port=0, redis_startup_timeout_s=0.3)
    with pytest.raises(StartupError) as exc:
        await start_service("echo", EchoApp(), settings)
    assert "cannot reach Redis at redis://127.0.0.1:1/0" in str(exc.value) and "\n" not in str(exc.value)


async def test_port_in_use_is_a_startup_error(redis_url: str) -> None:
    async with serve_in_process("echo", EchoApp(), _settings(redis_url)) as running:
        with pytest.raises(StartupError, match="cannot listen"):
            await start_service("echo", EchoApp(), _settings(redis_url, port=running.port))
