"""The `tao` console script.

Command names are a public contract (docs/architecture.md#command-names). Each command lives in its own module
exposing ``add_arguments(parser)`` and ``run(args) -> int``; the module is imported only
when its command runs, so `tao health` does not pay for matplotlib and a broken optional
command cannot break the others. A command that needs a missing optional extra (``report``,
``faults``: services/common/extras.py) stops with one line naming the extra.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from services.common.extras import MissingExtra, extra_of

# (command words) -> (module, one-line help). Longest match wins.
COMMANDS: dict[tuple[str, ...], tuple[str, str]] = {
    ("up",): ("services.up.cli", "run the whole stack on this machine with an agent workload"),
    ("serve",): ("services.common.serve_cli", "run one service: router | planner | predictor | budget"),
    ("health",): ("services.common.health_cli", "gRPC health probe of HOST:PORT (exit 0 when SERVING)"),
    ("vllm-sim",): ("services.sim.vllm_sim.cli", "one emulated vLLM replica (OpenAI HTTP API, /metrics)"),
    ("workload", "generate"): ("services.sim.workload.cli", "generate an agent workload trace (JSONL)"),
    ("sim", "run"): ("services.sim.cluster.cli", "discrete-event comparison of placement policies"),
    ("planner", "solve"): ("services.planner.cli", "solve one snapshot JSON, print the plan"),
    ("predictor", "replay"): ("services.predictor.cli", "replay tool events, print prediction accuracy"),
    ("bench", "e2e"): ("services.driver.cli", "drive a live stack (or any OpenAI endpoint) with a trace"),
    ("bench", "budget"): ("bench.budget.cli", "static vs dynamic tenant budget on the engine model"),
    ("check", "faults"): ("bench.faults.cli", "inject faults into a live stack and summarise survival"),
    ("explain",): ("services.router.explain_cli", "why is this session waiting? (router GET /v1/sessions/{id})"),
    ("sessions",): ("services.router.sessions_cli", "list the router's sessions (GET /v1/sessions)"),
    ("tenants",): ("services.budget.tenants_cli", "the budget's tenants: caps, limits, rate limits (GetAllocation)"),
    ("tenants", "set"): ("services.budget.tenants_set_cli", "replace the budget's tenant set (ConfigureTenants)"),
    ("tenants", "policy"): ("services.budget.tenants_policy_cli", "switch the budget's policy: static | dynamic"),
}


#: Benchmarks and fault suites (``bench/``) are not in the wheel: they run from a source checkout.
CHECKOUT_ONLY = "bench."


class NotInWheel(RuntimeError):
    pass


def _import_command(module_name: str, prog: str) -> object:
    """Import a command's module. ``bench.*`` lives beside ``services/`` in a source checkout
    (an editable install, or ``python -m`` from the checkout) and nowhere in an installed wheel."""
    if not module_name.startswith(CHECKOUT_ONLY):
        return importlib.import_module(module_name)
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name not in ("bench", module_name.rsplit(".", 1)[0], module_name):
            raise
    root = Path(__file__).resolve().parents[1]
    if not (root / "bench" / "__init__.py").is_file():
        raise NotInWheel(f"`{prog}` runs from a source checkout of TAO (benchmarks and fault suites "
                         f"are not in the installed package): clone the repository, `pip install -e .` "
                         f"there and run it again")
    sys.path.insert(0, str(root))
    return importlib.import_module(module_name)


def _usage() -> str:
    width = max(len(" ".join(k)) for k in COMMANDS)
    lines = ["usage: tao <command> [options]", "", "commands:"]
    for words, (_, help_text) in sorted(COMMANDS.items()):
        lines.append(f"  {' '.join(words):<{width}}  {help_text}")
    lines.append("")
    lines.append("Run `tao <command> --help` for a command's options.")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(_usage())
        return 0 if args else 2
    match: tuple[str, ...] | None = None
    for words in sorted(COMMANDS, key=len, reverse=True):
        if tuple(args[: len(words)]) == words:
            match = words
            break
    if match is None:
        print(f"tao: unknown command {' '.join(args[:2])!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module_name, help_text = COMMANDS[match]
    prog = "tao " + " ".join(match)
    try:
        module: Any = _import_command(module_name, prog)
        parser = argparse.ArgumentParser(prog=prog, description=help_text)
        module.add_arguments(parser)
        ns = parser.parse_args(args[len(match):])
        return int(module.run(ns) or 0)
    except KeyboardInterrupt:
        return 130
    except NotInWheel as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    except MissingExtra as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:
        # a module-level import of an optional extra that should have been lazy: still one line
        extra = extra_of(exc.name)
        if extra is None:
            raise
        print(f"{prog}: {MissingExtra(prog, extra, exc.name or extra)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
