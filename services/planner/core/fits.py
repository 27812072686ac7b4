"""Engine-profile fits of the time estimates the planner's policies make: the prefill-reload
time of a context (Continuum's §5.2 quadratic, ``ContinuumConfig.prefill_*``: Continuum's TTL
and ``tao``'s reclaim and turn estimates) and the decode step time (``DecodeStepFit``:
``tao``'s turn estimate). Continuum profiles its one engine offline (arXiv 2511.02230 §5.2);
here each engine profile of the engine model (``services/sim/engine``) has its fit, by the
same recipe: prefill of 1k, 2k, … 128k tokens (capped at the profile's ``max_model_len``) in
``max_num_batched_tokens`` chunks, least squares on c1·n + c2·n²; decode steps of 1–256
sequences of 1k–32k tokens each, least squares on c0 + c1·batch + c2·kv_tokens, plus the
share of routed experts read for an MoE (prefill within 5 % from 4k tokens, decode within 7 %).
``tests/unit/planner/test_engine_fits.py`` re-fits the engine model and checks every entry
against it. Without a profile, policies use ``qwen3-32b-h100x2``'s fits (the defaults of
``ContinuumConfig`` and ``DecodeStepFit``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from services.planner.core.continuum import ContinuumConfig
from services.planner.core.tao import DecodeStepFit


@dataclass(frozen=True, slots=True)
class EngineFits:
    """Prefill reload c1·n + c2·n² seconds for n tokens; a decode step by ``decode``."""

    prefill_linear_s: float
    prefill_quadratic_s: float
    decode: DecodeStepFit

    def prefill(self, config: ContinuumConfig) -> ContinuumConfig:
        """``config`` with this profile's prefill-reload fit."""
        return replace(config, prefill_constant_s=0.0, prefill_linear_s=self.prefill_linear_s,
                       prefill_quadratic_s=self.prefill_quadratic_s)


ENGINE_FITS: dict[str, EngineFits] = {
    # the defaults: ContinuumConfig's and DecodeStepFit's own values
    "qwen3-32b-h100x2": EngineFits(5.10e-5, 1.18e-9, DecodeStepFit()),
    "qwen3-32b-h100x1": EngineFits(9.603e-5, 2.340e-9, DecodeStepFit(2.439e-2, 8.73e-5, 1.043e-7)),
    # the grid's 2-node setup (bench/sim/grid.py, QWEN3_32B_H100X4)
    "qwen3-32b-h100x4": EngineFits(2.860e-5, 5.887e-10, DecodeStepFit(8.35e-3, 7.12e-5, 2.608e-8)),
    # an MoE: its decode step is concave in the batch (more experts read), so the fit has the
    # routed-expert share as a fourth term; 8 of 160 routed experts per token (GLM-4.7's
    # config.json, as services/sim/engine/profiles.py); least squares on the relative error,
    # within 0.01 % from 1 to 256 sequences (the three linear terms alone: 32 %)
    "glm-4.7-fp8-h100x8": EngineFits(1.626e-5, 6.346e-10, DecodeStepFit(
        6.928e-3, 6.737e-5, 1.875e-8, per_expert_share_s=1.5474e-2, expert_miss=1 - 8 / 160)),
    "qwen2.5-3b-h200": EngineFits(8.722e-6, 3.296e-10, DecodeStepFit(2.832e-3, 6.40e-5, 1.024e-8)),
}


def fitted(profile: str | None) -> str | None:
    """``profile`` if it has fits, else None (a policy then uses the default profile's)."""
    return profile if profile in ENGINE_FITS else None


def engine_fits(profile: str) -> EngineFits:
    """The fits of engine profile ``profile`` (ValueError naming the known ones)."""
    try:
        return ENGINE_FITS[profile]
    except KeyError:
        raise ValueError(f"no engine fits for profile {profile!r}; known: {', '.join(sorted(ENGINE_FITS))}") from None
