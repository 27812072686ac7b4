"""Router overhead benchmark: added latency versus going straight to the replica."""
