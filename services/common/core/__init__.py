"""Pure cores shared by several services (no I/O, injected clock)."""
