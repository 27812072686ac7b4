"""Moved to ``bench.faults.protofuzz`` so `tao check faults` can use it too; kept importable here."""

from bench.faults.protofuzz import messages

__all__ = ["messages"]
