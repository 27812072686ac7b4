"""Arbitrary request bodies never make the emulated replica answer 500."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.sim.vllm_sim.server import start_vllm_sim

_scalars = st.one_of(st.none(), st.booleans(), st.integers(-(10**12), 10**12),
                     st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=20))
_json = st.recursive(_scalars, lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
                     max_leaves=12)
_message = st.fixed_dictionaries({"role": st.one_of(st.sampled_from(["user", "system", "assistant", "tool"]), _scalars)},
                                 optional={"content": _json, "name": _scalars, "tool_calls": _json})
_OPTIONAL = {
        "messages": st.one_of(st.lists(_message, max_size=3), _json),
        "prompt": st.one_of(st.text(max_size=30), st.lists(st.integers(-5, 10**6), max_size=20), _json),
        "model": st.one_of(st.just("Qwen/Qwen3-32B"), _scalars),
        "max_tokens": st.one_of(st.integers(-3, 40), _scalars),
        "min_tokens": st.one_of(st.integers(-3, 40), _scalars),
        "max_completion_tokens": st.one_of(st.integers(-3, 40), _scalars),
        "n": st.one_of(st.just(1), _scalars),
        "stream": st.one_of(st.booleans(), _scalars),
        "stream_options": st.one_of(st.fixed_dictionaries({"include_usage": st.booleans()}), _json),
        "ignore_eos": st.one_of(st.booleans(), _scalars),
        "tools": _json,
        "tao_synthetic": st.one_of(
            st.fixed_dictionaries({"session_id": st.text(max_size=5), "prompt_tokens": st.integers(-2, 5000)},
                                  optional={"shared_prefix_id": _scalars,
                                            "system_prompt_tokens": st.integers(-2, 5000)}),
            _json),
}
_body = st.one_of(
    st.fixed_dictionaries({}, optional=_OPTIONAL),
    st.fixed_dictionaries({"messages": st.lists(_message, min_size=1, max_size=3),
                           "prompt": st.text(min_size=1, max_size=30),
                           "max_tokens": st.integers(-1, 30)},
                          optional={k: v for k, v in _OPTIONAL.items() if k not in ("messages", "prompt", "max_tokens",
                                                                                  "model")}),
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(bodies=st.lists(st.tuples(st.sampled_from(["/v1/chat/completions", "/v1/completions", "/tokenize"]), _body),
                       min_size=1, max_size=1))
async def test_random_bodies_never_500(bodies: list[tuple[str, Any]]) -> None:
    async with start_vllm_sim("qwen3-32b-h100x2", port=0, time_scale=5000.0, max_model_len=4096) as sim, \
            aiohttp.ClientSession() as s:
        for path, body in bodies:
            async with s.post(sim.base_url + path, data=json.dumps(body),
                              headers={"Content-Type": "application/json"}) as r:
                raw = await r.read()
                assert r.status in (200, 400, 404), (r.status, raw[:300])
                if r.status != 200:
                    assert set(json.loads(raw)["error"]) == {"message", "type", "param", "code"}
        for raw_body in (b"[" * 100000, b"\xff\xfe", b"", b"nul"):
            async with s.post(sim.base_url + "/v1/chat/completions", data=raw_body) as r:
                assert r.status == 400
