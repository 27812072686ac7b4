"""OpenTelemetry tracing: off unless the standard ``OTEL_*`` variables switch it on.

On when ``OTEL_TRACES_EXPORTER`` names an exporter other than ``none`` (``otlp``, ``console``,
comma-separated), or, with ``OTEL_TRACES_EXPORTER`` unset, when ``OTEL_EXPORTER_OTLP_ENDPOINT``
or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is set (then ``otlp``). ``OTEL_SDK_DISABLED=true``
turns it off whatever else is set. Unlike the SDK's own default (``otlp`` always), nothing is
exported unless asked. The OTLP exporter reads its usual variables (endpoint, headers,
``OTEL_EXPORTER_OTLP[_TRACES]_PROTOCOL``: ``http/protobuf`` by default, the spec's default, or
``grpc``); ``OTEL_SERVICE_NAME`` overrides the service name ``tao-<service>``;
``OTEL_PROPAGATORS`` (default W3C ``tracecontext,baggage``) and ``OTEL_TRACES_SAMPLER`` work as
documented by OpenTelemetry.

The opentelemetry packages are the optional ``tracing`` extra and are imported only when
tracing is on: with it off, no tracer provider is installed, nothing here imports them and
``span`` is a shared ``nullcontext``. Tracing on without the extra stops the service at start
with one line (``extras.require``).

What is traced: the gRPC servers and clients (opentelemetry-instrumentation-grpc), the router's
HTTP gateway (opentelemetry-instrumentation-aiohttp-server), and by hand what no
instrumentation sees: the router's hold, upstream attempts (its own HTTP client, which gets the
``traceparent`` injected here) and first byte; the planner round; predictor ingest; budget tick.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping, MutableMapping
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from services.common.errors import StartupError
from services.common.extras import require

_OFF: AbstractContextManager[Any] = nullcontext()
#: the SDK tracer provider while tracing is on in this process, else None
_provider: Any = None
_tracers: dict[str, Any] = {}
_aiohttp_ready = False


def requested(env: Mapping[str, str] | None = None) -> bool:
    """Whether the ``OTEL_*`` variables in ``env`` (default: the process's) switch tracing on."""
    env = os.environ if env is None else env
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporters:
        return any(e.strip() not in ("", "none") for e in exporters.split(","))
    return bool(env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT"))


def enabled() -> bool:
    return _provider is not None


def provider() -> Any:
    """The installed SDK tracer provider, or None (tracing off)."""
    return _provider


def configure(service: str, env: Mapping[str, str] | None = None) -> bool:
    """Install the SDK tracer provider the ``OTEL_*`` variables ask for (once per process: the
    first service names it); True when tracing is on. Raises ``MissingExtra`` (tracing asked
    for, extra missing) or ``StartupError`` (an exporter name it does not know)."""
    env = os.environ if env is None else env
    if _provider is not None:
        return True
    if not requested(env):
        return False
    require("tracing", f"tracing in tao {service} (switched on by OTEL_* variables)")
    from opentelemetry import trace
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    name = env.get("OTEL_SERVICE_NAME") or f"tao-{service}"
    tp = TracerProvider(resource=Resource.create({SERVICE_NAME: name}))
    for exporter in _exporters(env):
        tp.add_span_processor(BatchSpanProcessor(exporter))
    install(tp)
    trace.set_tracer_provider(tp)
    return True


def _exporters(env: Mapping[str, str]) -> list[Any]:
    names = [n.strip() for n in (env.get("OTEL_TRACES_EXPORTER") or "otlp").lower().split(",")]
    out: list[Any] = []
    for name in names:
        if name in ("", "none"):
            continue
        if name == "console":
            from opentelemetry.sdk.trace.export import ConsoleSpanExporter

            out.append(ConsoleSpanExporter())
        elif name == "otlp":
            protocol = (env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
                        or "http/protobuf").strip().lower()
            if protocol == "grpc":
                from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
            elif protocol == "http/protobuf":
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # type: ignore[assignment]
                    OTLPSpanExporter,
                )
            else:
                raise StartupError(f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol!r}: use grpc or http/protobuf")
            out.append(OTLPSpanExporter())
        else:
            raise StartupError(f"OTEL_TRACES_EXPORTER={name!r}: use otlp, console or none")
    return out


def install(tp: Any) -> None:
    """Trace with ``tp`` (an SDK ``TracerProvider``) from now on; tests pass one with an
    in-memory exporter (the global provider is left alone)."""
    global _provider
    _provider = tp
    _tracers.clear()


def uninstall() -> None:
    """Tracing off again (tests)."""
    install(None)


def tracer(name: str) -> Any:
    """The tracer ``name`` of the installed provider, or None while tracing is off."""
    if _provider is None:
        return None
    tr = _tracers.get(name)
    if tr is None:
        tr = _tracers[name] = _provider.get_tracer(name)
    return tr


def span(scope: str, name: str, attributes: Mapping[str, Any] | None = None) -> AbstractContextManager[Any]:
    """A current span ``name`` of tracer ``scope`` (the span is the context value), or a shared
    no-op context while tracing is off (then the value is None)."""
    if _provider is None:
        return _OFF
    return tracer(scope).start_as_current_span(name, attributes=attributes)


def inject(headers: MutableMapping[str, str]) -> None:
    """Add the current context's propagation headers (W3C ``traceparent``) to ``headers``."""
    if _provider is not None:
        from opentelemetry import propagate

        propagate.inject(headers)


def grpc_server_interceptors() -> list[Any]:
    if _provider is None:
        return []
    from opentelemetry.instrumentation.grpc import aio_server_interceptor

    return [aio_server_interceptor(tracer_provider=_provider)]  # type: ignore[no-untyped-call]


def grpc_client_interceptors() -> list[Any]:
    if _provider is None:
        return []
    from opentelemetry.instrumentation.grpc import aio_client_interceptors

    return list(aio_client_interceptors(tracer_provider=_provider))  # type: ignore[no-untyped-call]


def aiohttp_middlewares() -> list[Any]:
    """The aiohttp-server instrumentation's middleware (the request's SERVER span, continuing
    the client's ``traceparent``), or none while tracing is off."""
    global _aiohttp_ready
    if _provider is None:
        return []
    from opentelemetry.instrumentation.aiohttp_server import (
        AioHttpServerInstrumentor,
        create_aiohttp_middleware,
    )

    if not _aiohttp_ready:
        # instrument() sets the module's settings (excluded URLs, semconv mode, metric
        # instruments) that the middleware reads, and swaps aiohttp's Application class for all
        # apps; uninstrument() swaps it back, so only the gateway gets the middleware (not the
        # metrics endpoint, nor in-process replicas in tests).
        inst = AioHttpServerInstrumentor()
        with warnings.catch_warnings():  # aiohttp frowns on the subclass it makes meanwhile
            warnings.simplefilter("ignore", DeprecationWarning)
            inst.instrument(tracer_provider=_provider)
        inst.uninstrument()
        _aiohttp_ready = True
    return [create_aiohttp_middleware(tracer_provider=_provider)]
