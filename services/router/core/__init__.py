"""The router's pure core: session state machine, footprint, cache evidence, plan
revalidation, tenant slots, snapshots for the local fallback and per-request routing.
No I/O; time is passed in (``now_s``, router clock)."""
