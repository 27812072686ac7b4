"""Inputs and outputs of the engine model (frozen dataclasses)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from services.sim.engine.tokens import TokenContent

FINISH_LENGTH = "length"
FINISH_STOP = "stop"
FINISH_ABORT = "abort"


@dataclass(frozen=True, slots=True)
class EngineRequest:
    """One generation request.

    ``content`` is the request's full token stream (prompt then outputs); the engine reads only
    block hashes of tokens it has computed. The engine generates exactly ``max_output_tokens``
    tokens (EOS is decided by the caller, who sets ``finish_reason_at_max`` to "stop" for an
    emulated EOS) unless ``max_model_len`` cuts it short (finish reason "length").
    """

    request_id: str
    content: TokenContent
    prompt_tokens: int
    max_output_tokens: int
    finish_reason_at_max: str = FINISH_LENGTH


@dataclass(frozen=True, slots=True)
class FinishedRequest:
    request_id: str
    prompt_tokens: int
    output_tokens: int
    cached_tokens: int  # prefix-cache hit tokens when first scheduled (vLLM num_cached_tokens)
    num_preemptions: int
    finish_reason: str


@dataclass(frozen=True, slots=True)
class StepResult:
    """What one engine step did. ``duration_s`` is the modelled GPU time of the step."""

    duration_s: float
    num_tokens: int  # tokens in the batch (prefill + decode)
    num_prefill_tokens: int  # tokens of sequences still in (or finishing) prefill
    num_seqs: int
    new_tokens: Mapping[str, int]  # request id -> output tokens produced this step
    first_token: tuple[str, ...]  # requests whose first output token was produced this step
    finished: tuple[FinishedRequest, ...]
    preempted: tuple[str, ...]  # requests preempted (by recompute) while scheduling this step

    @property
    def idle(self) -> bool:
        return self.num_tokens == 0
