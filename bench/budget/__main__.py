"""`python -m bench.budget [--json OUT] [--quick] [--sweep]` (same as `tao bench budget`)."""

from __future__ import annotations

import argparse
import sys

from bench.budget.cli import add_arguments, run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.budget", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
