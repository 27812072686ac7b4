"""When the OTEL_* variables switch tracing on (services/common/tracing.py)."""

from __future__ import annotations

import pytest

from services.common import tracing
from services.common.errors import StartupError


@pytest.mark.parametrize(("env", "on"), [
    ({}, False),
    ({"OTEL_TRACES_EXPORTER": "none"}, False),
    ({"OTEL_TRACES_EXPORTER": "otlp"}, True),
    ({"OTEL_TRACES_EXPORTER": "console,none"}, True),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, True),
    ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, False),
    ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"}, False),
    ({"OTEL_SERVICE_NAME": "x", "OTEL_RESOURCE_ATTRIBUTES": "a=b"}, False),
])
def test_requested_by_the_standard_variables(env: dict[str, str], on: bool) -> None:
    assert tracing.requested(env) is on


def test_off_means_nothing_installed() -> None:
    assert tracing.configure("router", {}) is False
    assert tracing.provider() is None and tracing.tracer("tao.router") is None
    assert tracing.grpc_server_interceptors() == [] and tracing.aiohttp_middlewares() == []
    headers: dict[str, str] = {}
    tracing.inject(headers)
    assert headers == {}


def test_unknown_exporter_is_a_startup_error() -> None:
    pytest.importorskip("opentelemetry.sdk.trace")
    with pytest.raises(StartupError, match="OTEL_TRACES_EXPORTER='zipkin'"):
        tracing._exporters({"OTEL_TRACES_EXPORTER": "zipkin"})
    (console,) = tracing._exporters({"OTEL_TRACES_EXPORTER": "console"})
    assert type(console).__name__ == "ConsoleSpanExporter"
    (otlp,) = tracing._exporters({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"})
    assert type(otlp).__module__.startswith("opentelemetry.exporter.otlp.proto.http")
