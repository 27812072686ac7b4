"""Tenant budget benchmark (seed 002): static vs dynamic on the engine model, in virtual time."""
