"""``tao vllm-sim --served-model-name A B --block-size N`` like vLLM's flags (issue 16 items 2, 3):
/v1/models lists every name, requests may name any of them and are answered with the first,
other names get vLLM's 404, and ``vllm:cache_config_info`` exports the block size, which the
engine's prefix caching uses (a shared system prefix is shared in whole blocks of that size)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import urllib.request
from typing import Any

import aiohttp
import openai
from conftest import FAST, REPO, Spawner

from services.sim.engine import get_profile
from services.sim.vllm_sim.server import start_vllm_sim


def test_cli_served_model_names_and_block_size(sim_spawner: Spawner) -> None:
    p = sim_spawner.spawn("--time-scale", str(FAST), "--served-model-name", "org/model", "alias",
                          "--block-size", "32", "--num-gpu-blocks", "600")
    try:
        client = openai.OpenAI(base_url=p.base_url + "/v1", api_key="none", max_retries=0, timeout=30)
        assert [m.id for m in client.models.list()] == ["org/model", "alias"]
        reply = client.chat.completions.create(model="alias", max_tokens=3,
                                               messages=[{"role": "user", "content": "hi"}])
        assert reply.model == "org/model"  # vLLM answers with the first served name
        try:
            client.chat.completions.create(model="other", max_tokens=3, messages=[{"role": "user", "content": "hi"}])
            raise AssertionError("an unserved model was accepted")
        except openai.NotFoundError as exc:
            assert exc.response.json() == {"error": {"message": "The model `other` does not exist.",
                                                     "type": "NotFoundError", "param": "model", "code": 404}}
        metrics = _get_text(p.base_url + "/metrics")
        info = next(line for line in metrics.splitlines() if line.startswith("vllm:cache_config_info{"))
        assert 'block_size="32"' in info and 'num_gpu_blocks="600"' in info
    finally:
        assert sim_spawner.stop(p) == 0


def test_cli_rejects_a_bad_block_size() -> None:
    done = subprocess.run([sys.executable, "-m", "services.cli", "vllm-sim", "--port", "0", "--block-size", "0"],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "block size must be a positive integer" in done.stderr


def _get_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as resp:  # loopback only
        return str(resp.read().decode())


async def _cached(http: aiohttp.ClientSession, url: str, session: str) -> int:
    body: dict[str, Any] = {"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}],
                            "tao_synthetic": {"session_id": session, "prompt_tokens": 400,
                                              "shared_prefix_id": "sys", "system_prompt_tokens": 48}}
    async with http.post(url + "/v1/chat/completions", json=body) as resp:
        assert resp.status == 200, await resp.text()
        usage = (await resp.json())["usage"]
    return int((usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0))


async def test_a_shared_prefix_is_shared_in_whole_blocks_of_the_replicas_size() -> None:
    # 48 shared system tokens: with 16-token blocks three blocks hold only shared tokens, with
    # 32-token blocks one does (the second mixes shared and session tokens, so it differs)
    for block_size, shared_hit in ((16, 48), (32, 32)):
        profile = dataclasses.replace(get_profile("qwen3-32b-h100x2"), block_size=block_size)
        async with start_vllm_sim(profile, time_scale=FAST, model_name="m", num_gpu_blocks=4000) as sim, \
                aiohttp.ClientSession() as http:
            assert await _cached(http, sim.base_url, "first") == 0
            assert await _cached(http, sim.base_url, "second") == shared_hit, block_size
            # the same session again hits every full block of its previous prompt
            assert await _cached(http, sim.base_url, "second") == (400 - 1) // block_size * block_size
