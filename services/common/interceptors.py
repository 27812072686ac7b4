"""gRPC server interceptors shared by every service: request id, access log, metrics,
bearer-token auth (health and reflection exempt) and domain-error mapping.

One wrapper handles all four RPC shapes; streaming handlers must be async generators.
"""

from __future__ import annotations

import hmac
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from prometheus_client import CollectorRegistry, Counter, Histogram

from services.common.errors import DomainError
from services.common.logging import get_logger, request_id_var

EXEMPT_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")
#: RPCs that change or reveal the whole service (operators only): they need the admin token
#: (``admin_token``, default ``auth_token``); the tenants' / runners' ``auth_token`` is refused there
ADMIN_METHODS = (
    "/tao.router.v1.RouterAdminService/",
    "/tao.budget.v1.BudgetService/ConfigureTenants",
    "/tao.budget.v1.BudgetService/SetPolicy",
)


class ServerMetrics:
    """The standard ``grpc_server_*`` metrics (names as in go-grpc-prometheus)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        labels = ["grpc_type", "grpc_service", "grpc_method"]
        self.started = Counter("grpc_server_started", "RPCs started on the server.", labels, registry=registry)
        self.handled = Counter(
            "grpc_server_handled", "RPCs completed on the server, regardless of success or failure.",
            [*labels, "grpc_code"], registry=registry,
        )
        self.handling_seconds = Histogram(
            "grpc_server_handling_seconds", "Response latency of RPCs handled by the server.", labels,
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=registry,
        )


def _split(method: str) -> tuple[str, str]:
    _, service, name = method.split("/", 2) if method.count("/") >= 2 else ("", "unknown", method)
    return service, name


def _rpc_type(handler: grpc.RpcMethodHandler) -> str:
    if handler.request_streaming and handler.response_streaming:
        return "bidi_stream"
    if handler.request_streaming:
        return "client_stream"
    if handler.response_streaming:
        return "server_stream"
    return "unary"


class ServiceInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, service: str, metrics: ServerMetrics, auth_token: str | None = None,
                 admin_token: str | None = None) -> None:
        """``auth_token``: every RPC but health/reflection needs it (None: open). ``admin_token``
        (None: ``auth_token``): the ``ADMIN_METHODS`` need it instead, and it is accepted
        everywhere ``auth_token`` is."""
        self._log = get_logger(service)
        self._metrics = metrics
        self._token = auth_token.encode() if auth_token else None
        admin = admin_token or auth_token
        self._admin = admin.encode() if admin else None

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        method = handler_call_details.method
        exempt = method.startswith(EXEMPT_PREFIXES)
        metadata = dict(handler_call_details.invocation_metadata or ())
        service, name = _split(method)
        kind = _rpc_type(handler)
        labels = (kind, service, name)
        authorised = exempt or self._authorised(method, metadata.get("authorization"))
        rid = str(metadata.get("x-request-id") or uuid.uuid4().hex[:16])

        def finish(context: grpc.aio.ServicerContext, started: float, error: BaseException | None,
                   code: grpc.StatusCode | None = None) -> None:
            if code is None:
                code = context.code() if hasattr(context, "code") else None
            if code is None:
                code = grpc.StatusCode.OK if error is None else grpc.StatusCode.UNKNOWN
            code_name = code.name if isinstance(code, grpc.StatusCode) else str(code)
            elapsed = time.perf_counter() - started
            self._metrics.handled.labels(*labels, code_name).inc()
            self._metrics.handling_seconds.labels(*labels).observe(elapsed)
            if not exempt:
                self._log.info("rpc", method=method, code=code_name, ms=round(elapsed * 1000, 3))
            if error is not None and not isinstance(error, (DomainError, grpc.aio.AbortError)):
                self._log.error("rpc failed", method=method, error=repr(error))

        # ``context.abort`` sends the status to the client before it raises, so a client could
        # see the error and scrape /metrics before a ``finally`` recorded it. Every status this
        # interceptor sends itself is therefore recorded first (``reject``); ``finish`` runs
        # once per RPC either way.
        async def reject(context: grpc.aio.ServicerContext, started: float, error: BaseException | None,
                         code: grpc.StatusCode, details: str) -> None:
            finish(context, started, error, code)
            await context.abort(code, details)

        async def begin(context: grpc.aio.ServicerContext, started: float) -> None:
            request_id_var.set(rid)
            self._metrics.started.labels(*labels).inc()
            if not authorised:
                await reject(context, started, None, grpc.StatusCode.UNAUTHENTICATED,
                             "missing or invalid bearer token")

        async def map_error(context: grpc.aio.ServicerContext, started: float, exc: DomainError) -> None:
            await reject(context, started, exc, exc.code, str(exc) or type(exc).__name__)

        async def unary_response(inner: Callable[..., Awaitable[Any]], request: Any,
                                 context: grpc.aio.ServicerContext) -> Any:
            started = time.perf_counter()
            error: BaseException | None = None
            recorded = False
            try:
                if not authorised:
                    recorded = True
                await begin(context, started)
                return await inner(request, context)
            except DomainError as exc:
                error, recorded = exc, True
                await map_error(context, started, exc)
            except BaseException as exc:
                error = exc
                raise
            finally:
                if not recorded:
                    finish(context, started, error)

        if not handler.response_streaming:
            if handler.request_streaming:
                inner_su = handler.stream_unary

                async def stream_unary(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
                    return await unary_response(inner_su, requests, context)

                return grpc.stream_unary_rpc_method_handler(
                    stream_unary, handler.request_deserializer, handler.response_serializer
                )
            inner_uu = handler.unary_unary

            async def unary_unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
                return await unary_response(inner_uu, request, context)

            return grpc.unary_unary_rpc_method_handler(
                unary_unary, handler.request_deserializer, handler.response_serializer
            )

        inner_stream = handler.unary_stream if not handler.request_streaming else handler.stream_stream

        async def streaming(request_or_iter: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            started = time.perf_counter()
            error: BaseException | None = None
            recorded = False
            try:
                if not authorised:
                    recorded = True
                await begin(context, started)
                async for item in inner_stream(request_or_iter, context):
                    yield item
            except DomainError as exc:
                error, recorded = exc, True
                await map_error(context, started, exc)
            except BaseException as exc:
                error = exc
                raise
            finally:
                if not recorded:
                    finish(context, started, error)

        if handler.request_streaming:
            return grpc.stream_stream_rpc_method_handler(
                streaming, handler.request_deserializer, handler.response_serializer
            )
        return grpc.unary_stream_rpc_method_handler(streaming, handler.request_deserializer, handler.response_serializer)

    def _authorised(self, method: str, header: str | None) -> bool:
        if method.startswith(ADMIN_METHODS):
            return self._admin is None or self._check_token(header, self._admin)
        if self._token is None:
            return True
        return self._check_token(header, self._token) or (
            self._admin is not None and self._check_token(header, self._admin))

    @staticmethod
    def _check_token(header: str | None, token: bytes) -> bool:
        if not header or not header.lower().startswith("bearer "):
            return False
        return hmac.compare_digest(header[7:].strip().encode(), token)


class BearerTokenAuth(grpc.AuthMetadataPlugin):
    """Client side: attach ``authorization: Bearer <token>`` (use with TLS channel credentials)."""

    def __init__(self, token: str) -> None:
        self._token = token

    def __call__(self, context: grpc.AuthMetadataContext, callback: grpc.AuthMetadataPluginCallback) -> None:
        callback((("authorization", f"Bearer {self._token}"),), None)
