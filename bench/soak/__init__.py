"""Soak benchmark: the whole stack under a steady agent workload for a bounded time,
tracking errors, RSS and open file descriptors of every process (not run in CI)."""
