"""Planner benchmarks: `python -m bench.planner [--quick]`."""
