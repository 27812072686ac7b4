"""Optional extras of the package and the one-line error when a command needs a missing one.

The services never need them unless asked. ``report`` (matplotlib, rich): `tao up`'s live view
and report PNGs, `tao sim run`'s tables and plots. ``faults`` (hypothesis): the gRPC fuzzing of
`tao check faults`. ``tracing`` (opentelemetry-*): OpenTelemetry tracing, needed only when the
``OTEL_*`` variables switch it on (``services/common/tracing.py``). Code that needs one imports it inside the function that uses it, after
``require(extra, feature)``; the `tao` console script prints a ``MissingExtra`` as one line.
"""

from __future__ import annotations

import importlib

DISTRIBUTION = "tao-control-plane"

#: the modules each extra provides (what ``require`` imports)
EXTRAS: dict[str, tuple[str, ...]] = {
    "report": ("matplotlib", "rich"),
    "faults": ("hypothesis",),
    "tracing": ("opentelemetry.sdk.trace", "opentelemetry.exporter.otlp.proto.http.trace_exporter",
                "opentelemetry.exporter.otlp.proto.grpc.trace_exporter",
                "opentelemetry.instrumentation.aiohttp_server", "opentelemetry.instrumentation.grpc"),
}
#: the distributions of an extra whose names differ from its modules' (pyproject lists these)
DISTRIBUTIONS: dict[str, tuple[str, ...]] = {
    "tracing": ("opentelemetry-api", "opentelemetry-sdk", "opentelemetry-exporter-otlp",
                "opentelemetry-instrumentation-aiohttp-server", "opentelemetry-instrumentation-grpc"),
}


class MissingExtra(Exception):
    """A command needs an optional extra that is not installed (deliberately not an
    ImportError, so no ``suppress(ImportError)`` can make a feature silently disappear)."""

    def __init__(self, feature: str, extra: str, module: str) -> None:
        self.feature, self.extra, self.module = feature, extra, module
        super().__init__(f"the '{extra}' extra is not installed ({module} missing; needed for {feature}): "
                         f"pip install '{DISTRIBUTION}[{extra}]'")


def extra_of(module: str | None) -> str | None:
    """The extra that provides top-level ``module`` (or a submodule of it), else None."""
    root = (module or "").split(".")[0]
    return next((extra for extra, modules in EXTRAS.items() if root in {m.split(".")[0] for m in modules}), None)


def require(extra: str, feature: str) -> None:
    """Import every module of ``extra``; raise ``MissingExtra`` naming ``feature`` when one is missing."""
    for module in EXTRAS[extra]:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise MissingExtra(feature, extra, module) from exc
