"""``python -m bench.faults [--fleet] ...``: the same as ``tao check faults`` (bench.faults.cli)."""

from __future__ import annotations

import argparse
import sys

from bench.faults import cli


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.faults", description=cli.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    cli.add_arguments(parser)
    return cli.run(parser.parse_args())


if __name__ == "__main__":
    sys.exit(main())
