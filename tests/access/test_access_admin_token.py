"""The admin RPCs have their own token (``admin_token``), separate from the tenants' and
runners' ``auth_token``; unset, it defaults to ``auth_token`` (backward compatible)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import grpc
import pytest

from services.common.settings import load_settings
from services.common.testing import serve_in_process
from services.router.server import RouterApp, Settings
from tao.router.v1 import router_pb2, router_pb2_grpc


@asynccontextmanager
async def router(redis_url: str, **tokens: Any) -> AsyncIterator[str]:
    settings = load_settings(Settings, redis_url=redis_url, port=0, http_port=0, redis_startup_timeout_s=2.0,
                             **tokens)
    async with serve_in_process("router", RouterApp(settings), settings) as running:
        yield running.address


async def list_sessions(address: str, token: str | None) -> grpc.StatusCode:
    md = (("authorization", f"Bearer {token}"),) if token else ()
    async with grpc.aio.insecure_channel(address) as ch:
        try:
            await router_pb2_grpc.RouterAdminServiceStub(ch).ListSessions(router_pb2.ListSessionsRequest(),
                                                                          metadata=md, timeout=5)
        except grpc.aio.AioRpcError as exc:
            return exc.code()
    return grpc.StatusCode.OK


async def test_admin_rpcs_need_the_admin_token(redis_url: str) -> None:
    async with router(redis_url, auth_token="tenant-tok", admin_token="admin-tok") as address:
        assert await list_sessions(address, "tenant-tok") == grpc.StatusCode.UNAUTHENTICATED
        assert await list_sessions(address, None) == grpc.StatusCode.UNAUTHENTICATED
        assert await list_sessions(address, "admin-tok") == grpc.StatusCode.OK


@pytest.mark.parametrize("tokens", [{"auth_token": "tok"}, {"admin_token": "tok"}])
async def test_admin_token_defaults_to_the_auth_token(redis_url: str, tokens: dict[str, str]) -> None:
    async with router(redis_url, **tokens) as address:
        assert await list_sessions(address, "tok") == grpc.StatusCode.OK
        assert await list_sessions(address, "other") == grpc.StatusCode.UNAUTHENTICATED


def test_interceptor_rules() -> None:
    from prometheus_client import CollectorRegistry

    from services.common.interceptors import ServerMetrics, ServiceInterceptor

    metrics = ServerMetrics(CollectorRegistry())
    both = ServiceInterceptor("t", metrics, "user", "admin")
    admin_rpc, user_rpc = "/tao.router.v1.RouterAdminService/ListSessions", "/tao.predictor.v1.PredictorService/X"
    assert both._authorised(admin_rpc, "Bearer admin") and not both._authorised(admin_rpc, "Bearer user")
    assert both._authorised(user_rpc, "Bearer user") and both._authorised(user_rpc, "Bearer admin")
    assert not both._authorised(user_rpc, None)
    assert both._authorised("/tao.budget.v1.BudgetService/GetAllocation", "Bearer user")
    assert not both._authorised("/tao.budget.v1.BudgetService/ConfigureTenants", "Bearer user")
    only_admin = ServiceInterceptor("t", metrics, None, "admin")  # tenants' RPCs open, admin ones not
    assert only_admin._authorised(user_rpc, None) and not only_admin._authorised(admin_rpc, None)
    legacy = ServiceInterceptor("t", metrics, "tok")
    assert legacy._authorised(admin_rpc, "Bearer tok") and legacy._authorised(user_rpc, "Bearer tok")
    assert ServiceInterceptor("t", metrics)._authorised(admin_rpc, None)
