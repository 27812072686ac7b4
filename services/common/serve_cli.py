"""`tao serve {router,planner,predictor,budget}`: one service with the shared bootstrap.

Each ``services/<svc>/server.py`` exposes ``Settings`` and ``build_app(settings)``, and
optionally ``add_cli_arguments(parser)`` / ``settings_overrides(args) -> dict``.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path
from types import ModuleType

from services.common.bootstrap import run_service
from services.common.errors import StartupError
from services.common.settings import ServiceSettings, load_settings

SERVICES = ("router", "planner", "predictor", "budget")


def _module(service: str) -> ModuleType:
    return importlib.import_module(f"services.{service}.server")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="service", required=True, metavar="{" + ",".join(SERVICES) + "}")
    for service in SERVICES:
        p = sub.add_parser(service, help=f"run the {service} service")
        p.add_argument("--host", default=None, help="gRPC bind address")
        p.add_argument("--port", type=int, default=None, help="gRPC port")
        p.add_argument("--metrics-port", type=int, default=None, help="Prometheus /metrics port")
        p.add_argument("--redis-url", default=None, help="redis:// or rediss:// URL")
        p.add_argument("--config", type=Path, default=None, help="YAML or JSON settings file")
        p.add_argument("--log-level", default=None, choices=["debug", "info", "warning", "error"])
        try:
            module = _module(service)
        except ImportError:  # reported at run time with one line
            continue
        extra = getattr(module, "add_cli_arguments", None)
        if extra is not None:
            extra(p)


def load_service_settings(module: ModuleType, args: argparse.Namespace) -> ServiceSettings:
    """The settings ``tao serve`` starts ``module``'s service with: its flags over the
    environment over the config file (``StartupError`` when invalid). The deployment tests
    load the compose files' commands through it."""
    overrides = {
        "host": args.host,
        "port": args.port,
        "metrics_port": args.metrics_port,
        "redis_url": args.redis_url,
        "log_level": args.log_level,
    }
    more = getattr(module, "settings_overrides", None)
    if more is not None:
        overrides.update(more(args))
    settings: ServiceSettings = load_settings(module.Settings, config_file=args.config, **overrides)
    return settings


def run(args: argparse.Namespace) -> int:
    service: str = args.service
    try:
        module = _module(service)
    except ImportError as exc:
        print(f"tao serve {service}: service not available: {exc}", file=sys.stderr)
        return 2
    try:
        settings = load_service_settings(module, args)
        app_factory = module.build_app
        return run_service(service, app_factory, settings)
    except StartupError as exc:
        print(f"tao serve {service}: {exc}", file=sys.stderr)
        return 2
