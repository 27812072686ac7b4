"""Discrete-event cluster simulator (`tao sim run`) and the oracle policy."""

from services.sim.cluster import oracle as _oracle  # registers "oracle" into the planner registry
from services.sim.cluster.simulator import ClusterSim, RunResult, SimConfig, SimulationError

__all__ = ["ClusterSim", "RunResult", "SimConfig", "SimulationError"]
del _oracle
