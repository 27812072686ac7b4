"""The no-contention lower bound equals the engine model playing each session alone, and no
policy's simulated latency is below it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from services.sim.cluster import SimConfig
from services.sim.cluster.lower_bound import cached_lower_bound, lower_bound
from services.sim.cluster.runner import compare
from services.sim.engine import ChainCache, Engine, EngineRequest, get_profile
from services.sim.workload.generate import GenerateOptions, generate
from services.sim.workload.trace import TraceSession


def _alone_on_engine(s: TraceSession, profile_name: str, budget: int | None = None) -> float:
    """The session alone on a real engine, stepped one step at a time (the reference)."""
    profile = get_profile(profile_name)
    if budget is not None:
        profile = replace(profile, max_num_batched_tokens=budget)
    eng = Engine(profile, num_gpu_blocks=20_000)
    chains = ChainCache()
    if s.shared_prefix_id:  # warm the shared system prompt, as another session would have
        warm = chains.synthetic("someone-else", s.shared_prefix_id, s.system_prompt_tokens)
        eng.add_request(EngineRequest("warm", warm, s.system_prompt_tokens, 1))
        while eng.has_work():
            eng.step()
    content = chains.synthetic(s.session_id, s.shared_prefix_id, s.system_prompt_tokens)
    t = 0.0
    context = s.system_prompt_tokens
    for i, turn in enumerate(s.turns):
        prompt = context + turn.append_tokens
        eng.add_request(EngineRequest(f"r{i}", content, prompt, turn.output_tokens))
        while eng.has_work():
            t += eng.step().duration_s
        context = prompt + turn.output_tokens
        if turn.tool is not None:
            t += turn.tool.duration_s
    return t


@pytest.mark.parametrize(("kind", "profile", "budget"), [
    ("swe-lite", "qwen3-32b-h100x2", None),
    ("terminal-bench", "qwen3-32b-h100x2", 512),  # small budget: prompts prefill in several chunks
    ("chat-bursty", "glm-4.7-fp8-h100x8", None),
])
def test_bound_equals_the_engine_alone(kind: str, profile: str, budget: int | None) -> None:
    sessions = generate(GenerateOptions(kind=kind, sessions=3, seed=5, max_turns=5, max_context_tokens=20_000))
    lb = lower_bound(sessions, get_profile(profile), budget)
    for s, b in zip(sessions, lb.sessions, strict=True):
        ref = _alone_on_engine(s, profile, budget)
        assert b.session_id == s.session_id
        assert b.latency_s == pytest.approx(ref, rel=1e-9, abs=1e-9)
        assert b.tool_s == pytest.approx(sum(t.tool.duration_s for t in s.turns if t.tool))


def test_no_policy_beats_the_bound_and_it_is_cached() -> None:
    sessions = generate(GenerateOptions(kind="swe-lite", sessions=6, seed=2, max_turns=4, max_context_tokens=9000))
    cfg = SimConfig(replicas=1, profile="qwen3-32b-h100x2", num_gpu_blocks=900, tick_s=0.5)
    doc, outcomes = compare(sessions, ["tao", "round_robin", "oracle"], cfg)
    bound = doc["lower_bound"]
    assert bound["sessions"] == 6 and bound["mean_task_latency_s"] > 0
    for o in outcomes:
        lat = {r.session_id: r.end_s - r.start_s for r in o.run.sessions}
        per = {b.session_id: b.latency_s for b in cached_lower_bound(sessions, get_profile(cfg.profile)).sessions}
        assert all(lat[sid] >= per[sid] - 1e-9 for sid in lat)
        ratio = doc["policies"][o.name]["latency_over_lower_bound"]
        assert ratio == pytest.approx(o.metrics["mean_task_latency_s"] / bound["mean_task_latency_s"])
        assert ratio >= 1.0
    assert cached_lower_bound(sessions, get_profile(cfg.profile)) is cached_lower_bound(
        sessions, get_profile(cfg.profile))
