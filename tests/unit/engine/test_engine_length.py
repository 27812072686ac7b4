"""vLLM's length check, one rule for the emulated replica's 400 and the cluster simulator."""

from __future__ import annotations

import pytest

from services.sim.engine import length_violation
from services.sim.vllm_sim.protocol import ApiError, GenRequest, check_length


def test_length_violation_follows_vllm_validate_input() -> None:
    assert length_violation(99, 1, 100) is None  # prompt + max_tokens == max_model_len fits
    assert length_violation(99, 2, 100) == "max_tokens"
    assert length_violation(100, 1, 100) == "prompt"
    assert length_violation(100, None, 100) == "prompt"
    assert length_violation(10, None, 100) is None  # no max_tokens: vLLM fills the context


@pytest.mark.parametrize(("prompt", "max_tokens"), [(50, 50), (50, 51), (100, 1), (99, None), (100, None)])
def test_the_emulated_replica_refuses_exactly_what_the_rule_refuses(prompt: int, max_tokens: int | None) -> None:
    req = GenRequest(kind="completion", model="m", prompt_ids=tuple(range(prompt)), synthetic=None,
                     max_tokens=max_tokens, min_tokens=0, ignore_eos=False, stream=False, include_usage=False,
                     continuous_usage=False)
    refused = False
    try:
        check_length(req, 100)
    except ApiError as exc:
        assert exc.status == 400
        refused = True
    assert refused == (length_violation(prompt, max_tokens, 100) is not None)
