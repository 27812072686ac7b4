"""Real peers (vllm-router, sglang-router) next to TAO on the same emulated replicas: `python -m bench.peers`."""
