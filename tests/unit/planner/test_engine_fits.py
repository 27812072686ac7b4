"""Engine-profile fits (services/planner/core/fits.py): each entry against a fresh fit of the
engine model, and make_policy applying them."""

from __future__ import annotations

import numpy as np
import pytest

from bench.sim.grid import QWEN3_32B_H100X4
from services.planner.core.continuum import ContinuumPolicy, prefill_reload_s
from services.planner.core.fits import ENGINE_FITS, engine_fits
from services.planner.core.registry import make_policy
from services.planner.core.tao import TaoPolicy
from services.planner.settings import Settings
from services.sim.cluster.oracle import OraclePolicy
from services.sim.engine.profiles import PROFILES, Profile
from services.sim.engine.step_time import StepTimeModel


def _profiles() -> dict[str, Profile]:
    return {**PROFILES, QWEN3_32B_H100X4.name: QWEN3_32B_H100X4}


def _prefill_s(model: StepTimeModel, tokens: int, chunk: int) -> float:
    """The engine model's time to prefill ``tokens`` from nothing, in chunks of ``chunk``."""
    t, done = 0.0, 0
    while done < tokens:
        c = min(chunk, tokens - done)
        t += model.step_time_s(c, 1, 1, done + c, c * done + c * (c + 1) / 2)
        done += c
    return t


def test_every_profile_has_fits_and_every_fit_a_profile() -> None:
    assert set(ENGINE_FITS) == set(_profiles())


@pytest.mark.parametrize("name", sorted(ENGINE_FITS))
def test_the_fits_reproduce_the_engine_models_prefill_and_decode_times(name: str) -> None:
    profile = _profiles()[name]
    model = StepTimeModel(profile)
    fits = engine_fits(name)
    cfg = fits.prefill(ContinuumPolicy().config)
    for tokens in (4096, 16384, 65536, 131072):
        if tokens > profile.max_model_len:
            continue
        truth = _prefill_s(model, tokens, profile.max_num_batched_tokens)
        assert prefill_reload_s(tokens, cfg) == pytest.approx(truth, rel=0.08), (name, tokens)
    for batch in (1, 16, 64, 256):
        for context in (1000, 8000, 32000):
            truth = model.decode_step_time_s(batch, context)
            assert fits.decode.step_s(batch, batch * (context + 1)) == pytest.approx(truth, rel=0.07), (batch, context)


def test_the_fits_differ_enough_between_profiles_to_matter() -> None:
    # GLM on 8 H100s prefills a 32k context 2.4x faster than Qwen3-32B on 2: one TTL for both was wrong
    glm, qwen = engine_fits("glm-4.7-fp8-h100x8"), engine_fits("qwen3-32b-h100x2")
    base = ContinuumPolicy().config
    assert prefill_reload_s(32768, qwen.prefill(base)) > 2 * prefill_reload_s(32768, glm.prefill(base))


def test_make_policy_applies_a_profiles_fits_to_tao_continuum_and_the_oracle() -> None:
    fits = engine_fits("glm-4.7-fp8-h100x8")
    tao = make_policy("tao", engine_profile="glm-4.7-fp8-h100x8")
    assert isinstance(tao, TaoPolicy) and tao.config.decode_model == fits.decode
    assert tao.config.ttl_model.prefill_linear_s == fits.prefill_linear_s
    assert tao.config.ttl and tao.config.ttl_turn  # the rest of the config is kept
    co = make_policy("continuum", engine_profile="glm-4.7-fp8-h100x8")
    assert isinstance(co, ContinuumPolicy) and co.config.prefill_quadratic_s == fits.prefill_quadratic_s
    oracle = make_policy("oracle", engine_profile="glm-4.7-fp8-h100x8")
    assert isinstance(oracle, OraclePolicy) and oracle.uses_ground_truth
    assert oracle.config.decode_model == fits.decode
    default = make_policy("tao")
    assert isinstance(default, TaoPolicy) and default.config.decode_model == engine_fits("qwen3-32b-h100x2").decode
    assert make_policy("round_robin", engine_profile="glm-4.7-fp8-h100x8").name == "round_robin"
    with pytest.raises(ValueError, match="no engine fits"):
        make_policy("tao", engine_profile="gpt-9")


def test_the_planner_setting_names_a_profile_with_fits() -> None:
    assert Settings(engine_profile="glm-4.7-fp8-h100x8").engine_profile == "glm-4.7-fp8-h100x8"
    with pytest.raises(ValueError, match="no engine fits"):
        Settings(engine_profile="gpt-9")
    assert np.isfinite(engine_fits("qwen2.5-3b-h200").prefill_linear_s)
