"""Emulated vLLM replica: the engine model behind vLLM's OpenAI HTTP surface (see README.md).

``start_vllm_sim`` (in ``services.sim.vllm_sim.server``) serves one replica in the current event loop;
``tao vllm-sim`` (``services.sim.vllm_sim.cli``) serves one per process.
"""
