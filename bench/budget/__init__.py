"""Tenant budget benchmark (the budget-controller study's scenario): static vs dynamic on the engine model, in virtual time."""
