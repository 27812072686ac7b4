"""Calibration of the step-time model against published points (each with its source)."""

from __future__ import annotations

import math
import random

import pytest

from services.sim.engine import PROFILES, Engine, EngineRequest, StepTimeModel, get_profile
from services.sim.engine.profiles import CODELLAMA_34B, GLM47_FP8, H100_SXM, QWEN3_32B, QWEN25_3B, Profile
from services.sim.engine.tokens import SyntheticContent


def test_model_shapes_give_published_parameter_counts() -> None:
    # Model cards: Qwen3-32B 32.8B, Qwen2.5-3B 3.09B, CodeLlama-34B 33.7B, GLM-4.5/4.7 355B-A32B.
    assert QWEN3_32B.total_params / 1e9 == pytest.approx(32.8, rel=0.01)
    assert QWEN25_3B.total_params / 1e9 == pytest.approx(3.09, rel=0.01)
    assert CODELLAMA_34B.total_params / 1e9 == pytest.approx(33.7, rel=0.01)
    assert GLM47_FP8.total_params / 1e9 == pytest.approx(355, rel=0.02)
    assert GLM47_FP8.active_params_per_token / 1e9 == pytest.approx(32, rel=0.05)


def test_dense_32b_decode_floor_on_one_h100() -> None:
    # A 32B dense BF16 model streams ~64 GB of weights per decode step; at H100's 3.35 TB/s and
    # the ~80 % bandwidth real GEMV kernels reach, the floor is ~24 ms/step on one GPU
    # (e.g. vLLM / "LLM inference speed of light" analyses; 64 GB / 2.7 TB/s).
    t = StepTimeModel(get_profile("qwen3-32b-h100x1")).decode_step_time_s(1, 256)
    assert t == pytest.approx(0.024, rel=0.10)


@pytest.mark.parametrize(("tokens", "ms"), [(1, 24.4), (512, 53.0), (4096, 423.0)])
def test_vidur_codellama34b_h100_linear_layer_times(tokens: int, ms: float) -> None:
    # Vidur (Agrawal et al., MLSys 2024) profiled CodeLlama-34B linear layers on one H100:
    # 1 token 24.4 ms, 512 tokens 53 ms, 4k tokens 423 ms. Our linear roofline within +-15 %.
    profile = Profile("codellama-34b-h100x1", CODELLAMA_34B, H100_SXM, tp=1)
    t = StepTimeModel(profile).linear_time_s(tokens, num_sampled=1)
    assert t * 1e3 == pytest.approx(ms, rel=0.15)


def _sharegpt_like(n: int, seed: int) -> list[tuple[int, int]]:
    # ShareGPT as sampled by vLLM's benchmarks: prompts of 4..1024 tokens, prompt + output <= 2048,
    # mean prompt ~180-220 and mean output ~190-200 tokens; heavy-tailed (log-normal fit).
    rng = random.Random(seed)
    out: list[tuple[int, int]] = []
    while len(out) < n:
        p = int(rng.lognormvariate(math.log(120), 1.1))
        o = int(rng.lognormvariate(math.log(100), 1.2))
        if p < 4 or o < 4 or p > 1024 or p + o > 2048:
            continue
        out.append((p, o))
    return out


def test_qwen3_32b_one_h100_sharegpt_throughput() -> None:
    # Qwen3-32B BF16 on one H100 with stock vLLM serves ~2.1-2.4k total (prompt + output)
    # tokens/s on a ShareGPT-like load (from public vLLM
    # throughput runs). Offline-throughput style: 1000 requests queued at t = 0.
    e = Engine(get_profile("qwen3-32b-h100x1"))
    reqs = _sharegpt_like(1000, seed=0)
    for i, (p, o) in enumerate(reqs):
        e.add_request(EngineRequest(f"r{i}", SyntheticContent(f"s{i}"), p, o))
    t = 0.0
    while e.has_work():
        t += e.step().duration_s
    total = sum(p + o for p, o in reqs)
    assert total / t == pytest.approx(2250, rel=0.25)


def test_tp2_is_faster_than_tp1_and_moe_touches_fewer_experts_at_small_batch() -> None:
    tp1 = StepTimeModel(get_profile("qwen3-32b-h100x1")).decode_step_time_s(1, 1000)
    tp2 = StepTimeModel(get_profile("qwen3-32b-h100x2")).decode_step_time_s(1, 1000)
    assert 0.45 * tp1 < tp2 < 0.75 * tp1
    glm = StepTimeModel(get_profile("glm-4.7-fp8-h100x8"))
    assert glm.weight_bytes_read(1) < 0.2 * glm.weight_bytes_read(4096)
    assert glm.weight_bytes_read(4096) == pytest.approx(GLM47_FP8.weight_bytes / 8, rel=0.01)


def test_step_time_grows_with_context_and_batch() -> None:
    for profile in PROFILES.values():
        m = StepTimeModel(profile)
        assert m.step_time_s(0, 0, 0, 0, 0.0) == 0.0
        assert m.decode_step_time_s(1, 1000) < m.decode_step_time_s(1, 30000)
        assert m.decode_step_time_s(8, 1000) < m.decode_step_time_s(64, 1000)


def test_default_kv_capacity_follows_memory_budget() -> None:
    for profile in PROFILES.values():
        blocks = profile.default_num_gpu_blocks
        kv_bytes = blocks * 16 * profile.kv_bytes_per_token_per_gpu
        assert kv_bytes <= profile.kv_bytes_available_per_gpu
        assert blocks * 16 >= profile.max_model_len  # one max-length request fits
    # qwen3-32b on 2xH100: 2 * (0.9 * 79.2 GiB - 30.5 GiB - 4 GiB) / 256 KiB per token ~ 300k tokens.
    assert get_profile("qwen3-32b-h100x2").default_num_gpu_blocks * 16 == pytest.approx(301_000, rel=0.02)


def test_unknown_profile_lists_names() -> None:
    with pytest.raises(ValueError, match="qwen3-32b-h100x2"):
        get_profile("nope")
