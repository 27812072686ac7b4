"""`tao sessions`: list the router's sessions like ``kubectl get`` (``GET /v1/sessions``)."""

from __future__ import annotations

import argparse

from services.router.explain_cli import add_common, run_sessions


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common(parser)
    parser.add_argument("--phase", default=None, choices=("WAITING", "RUNNING", "ACTING", "PAUSED"),
                        help="only sessions in this phase")
    parser.add_argument("--only-tenant", default=None, help="only this tenant's sessions")


def run(args: argparse.Namespace) -> int:
    return run_sessions(args)
