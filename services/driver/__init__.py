"""The agent trace driver: plays an agent trace (docs/architecture.md#trace-format) against a live
OpenAI-compatible endpoint — the workload of `tao up` and of `tao bench e2e` (``cli``).

Product code: `tao up` ships it, so it lives in the service tree; the benchmarks (bench/) import
it from here, never the other way round."""
