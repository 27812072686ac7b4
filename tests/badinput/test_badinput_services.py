"""Bad input against the live services (`tao serve` processes over a real Redis, one
`tao vllm-sim` replica behind a recording tap): every HTTP endpoint of the router and of the
replica, every gRPC RPC of tao.{planner,predictor,budget,router}.v1 fuzzed with hypothesis.

Each input must get its documented error (OpenAI-style body for HTTP; INVALID_ARGUMENT,
FAILED_PRECONDITION, RESOURCE_EXHAUSTED, UNAVAILABLE, NOT_FOUND, ALREADY_EXISTS for gRPC;
never a 500, UNKNOWN or INTERNAL), change nothing when rejected, and leave every service
SERVING. The catalogue and the fuzzer are ``bench.faults.badinput`` (shared with
``tao check faults``). The router bugs this suite found are fixed, and each has a
regression test below: the context length judged by the router itself, a session the
replica refused dropped at once, hostile replica ids refused by ``AddReplica``.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from bench.faults import badinput
from bench.faults.env import MODEL, EnvConfig, FaultEnv
from services.common import keys
from services.common.testing import find_redis_binary
from tao.router.v1 import router_pb2, router_pb2_grpc

pytestmark = pytest.mark.skipif(find_redis_binary() is None, reason="needs a redis-server binary")

BODY_LIMIT = 1 << 20
EXAMPLES = 25  # per RPC and per kind (arbitrary / near-valid): ~1,000 calls in all


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultEnv]:
    log_dir: Path = tmp_path_factory.mktemp("badinput-stack-logs")
    settings = {**EnvConfig().env, "TAO_ROUTER_MAX_BODY_BYTES": str(BODY_LIMIT)}
    # held requests give up after 1 wall second (20 model s at scale 20)
    fault_env = FaultEnv(EnvConfig(replicas=1, log_dir=log_dir, env=settings, hold_timeout_s=20.0))
    try:
        fault_env.start()
        yield fault_env
    finally:
        fault_env.stop()


def _router_probe(env: FaultEnv, http: httpx.Client) -> Any:
    redis = env.redis()

    def probe() -> Any:
        health = http.get("/health").json()
        return health["sessions"], health["held_requests"], sorted(redis.hkeys(keys.SESSIONS))

    return probe


def _replica_probe(http: httpx.Client) -> Any:
    def probe() -> Any:
        text = http.get("/metrics").text
        values = {}
        for family in text_string_to_metric_families(text):
            if family.name in ("vllm:request_success", "vllm:num_requests_running", "vllm:num_requests_waiting",
                               "vllm:prompt_tokens"):
                values[family.name] = sum(s.value for s in family.samples if not s.name.endswith("_created"))
        return values

    return probe


def _assert_alive(env: FaultEnv) -> None:
    assert not env.dead(), f"died: {env.dead()} (logs {env.stack.config.log_dir})"
    status = asyncio.run(env.wait_serving(timeout_s=10))
    assert all(s == "SERVING" for s in status.values()), status


def test_router_http_endpoints_reject_bad_input_cleanly(env: FaultEnv) -> None:
    cases = badinput.router_cases(MODEL, BODY_LIMIT)
    tally = badinput.Tally()
    with httpx.Client(base_url=env.addr.router_url, timeout=30) as http:
        received = len(env.tap_log.completions())
        badinput.run_http(http, cases, tally, _router_probe(env, http), settle_s=0.1)
        forwarded = env.tap_log.completions()[received:]
        ok = http.post("/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": "x"}],
                                                     "max_tokens": 4})
    assert tally.tried == len(cases) > 40
    assert tally.crashes == 0 and tally.unexpected == 0 and tally.state_changes == 0, tally.problems
    assert tally.rejected >= len(cases) - 4
    # what the router rejects itself never reaches the replica; what it forwards (limits only
    # the replica knows) the replica rejects, and the router passes that answer on
    reached = {r.marker for r in forwarded}
    assert reached <= {f"{k}: {n}" for k in ("chat", "completions")
                       for n in ("huge prompt (context too long)", "max_tokens beyond int64")}, reached
    assert all(r.status == 400 for r in forwarded), [(r.marker, r.status) for r in forwarded]
    assert ok.status_code == 200, ok.text
    _assert_alive(env)


def test_replica_http_endpoints_reject_bad_input_cleanly(env: FaultEnv) -> None:
    cases = badinput.replica_cases(MODEL)
    rejected_cases = [c for c in cases if all(s >= 400 for s in c.expect)]
    tally = badinput.Tally()
    with httpx.Client(base_url=env.addr.replicas[0], timeout=30) as http:
        badinput.run_http(http, rejected_cases, tally, _replica_probe(http))
        accepted = badinput.Tally()
        badinput.run_http(http, [c for c in cases if c not in rejected_cases], accepted)
    assert tally.crashes == 0 and tally.unexpected == 0 and tally.state_changes == 0, tally.problems
    assert tally.rejected == len(rejected_cases) > 30
    assert accepted.accepted == len(cases) - len(rejected_cases), accepted.problems
    _assert_alive(env)


def test_router_judges_the_context_length_itself(env: FaultEnv) -> None:
    """A request that cannot fit the model's context (max_tokens beyond it, or an exact
    prompt length at or past it) is a 400 from the router, as vLLM words it, before any
    session exists: it is neither held until the hold timeout nor left behind as a session
    (both were bugs: a 503 after the hold timeout, and a session the replica then refused)."""
    with httpx.Client(base_url=env.addr.router_url, timeout=30) as http:
        probe = _router_probe(env, http)
        before = probe()
        received = len(env.tap_log.completions())
        (card,) = http.get("/v1/models").json()["data"]
        mml = card["max_model_len"]
        cases = [
            {"max_tokens": 10**12},
            {"max_tokens": mml + 1},
            {"tao_synthetic": {"session_id": "ctx-long", "prompt_tokens": 10**9}},
            {"tao_synthetic": {"session_id": "ctx-at", "prompt_tokens": mml}},
            {"tao_synthetic": {"session_id": "ctx-sum", "prompt_tokens": mml // 2}, "max_tokens": mml // 2 + 1},
        ]
        for i, extra in enumerate(cases):
            body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], **extra}
            r = http.post("/v1/chat/completions", json=body, headers={"x-session-id": f"ctx-{i}"})
            assert r.status_code == 400, (extra, r.status_code, r.text)
            err = r.json()["error"]
            assert err["code"] == "context_length_exceeded" and "maximum context length" in err["message"], err
        assert env.tap_log.completions()[received:] == []  # nothing reached the replica
        assert probe() == before


def test_router_drops_a_session_the_replica_refused(env: FaultEnv) -> None:
    """A text prompt too long for the context is only known to the replica's tokenizer: the
    router forwards it, passes the replica's 400 on, and the session that request created
    ends at once instead of lingering until its TTL."""
    words = "word " * ((BODY_LIMIT - 4096) // 5)
    with httpx.Client(base_url=env.addr.router_url, timeout=30) as http:
        probe = _router_probe(env, http)
        before = probe()
        r = http.post("/v1/chat/completions", headers={"x-session-id": "refused-by-replica"},
                      json={"model": MODEL, "messages": [{"role": "user", "content": words}], "max_tokens": 4})
        assert r.status_code == 400, r.text
        assert "maximum context length" in r.json()["error"]["message"]
        deadline = time.monotonic() + 5
        while probe() != before and time.monotonic() < deadline:
            time.sleep(0.05)
        assert probe() == before
        # a session with a completed request is not dropped by a later refusal
        ok = http.post("/v1/chat/completions", headers={"x-session-id": "refused-later"},
                       json={"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 4})
        assert ok.status_code == 200, ok.text
        r = http.post("/v1/chat/completions", headers={"x-session-id": "refused-later"},
                      json={"model": MODEL, "messages": [{"role": "user", "content": words}], "max_tokens": 4})
        assert r.status_code == 400
        assert "refused-later" in {s for s in probe()[2]}
        http.post("/v1/sessions/refused-later/release")


def test_router_add_replica_rejects_hostile_ids(env: FaultEnv) -> None:
    """Replica ids end up in Redis, Prometheus labels and response headers: 1-256 printable
    characters, like session ids (the gRPC fuzz suite found 80 kB and bidi-override ids
    accepted; fixed in the router's AddReplica)."""
    with grpc.insecure_channel(env.addr.router_admin) as ch:
        stub = router_pb2_grpc.RouterAdminServiceStub(ch)
        codes = []
        for rid in ("x" * 80_000, "a\u202eb", "bad\x00id"):
            try:
                stub.AddReplica(router_pb2.AddReplicaRequest(id=rid, url="http://127.0.0.1:9"), timeout=5)
                codes.append(grpc.StatusCode.OK)
            except grpc.RpcError as exc:
                codes.append(exc.code())
    assert codes == [grpc.StatusCode.INVALID_ARGUMENT] * 3, codes


@pytest.mark.parametrize("service", ["planner", "predictor", "budget", "router"])
def test_grpc_rpcs_fuzzed(env: FaultEnv, service: str) -> None:
    addresses = {"planner": env.addr.planner, "predictor": env.addr.predictor, "budget": env.addr.budget,
                 "router": env.addr.router_admin}
    tally = badinput.Tally()
    started = time.monotonic()
    seen: list[str] = []
    badinput.fuzz_all(addresses, env.redis(), env.config.time_scale, EXAMPLES, tally, strict=True, only=service,
                      on_target=lambda t, _: seen.append(t.name))
    expected = {t.name for t in badinput.rpc_targets() if t.service == service}
    assert set(seen) == expected
    assert tally.tried >= len(expected) and tally.rejected > 0
    assert tally.crashes == 0 and tally.unexpected == 0 and tally.state_changes == 0, tally.problems
    assert time.monotonic() - started < 60
    _assert_alive(env)


def test_no_unknown_or_internal_in_server_metrics(env: FaultEnv) -> None:
    """The services' own counters agree: after all the fuzzing, no RPC ended UNKNOWN/INTERNAL
    (read from the router's Prometheus endpoint, which also carries its gRPC server metrics)."""
    with httpx.Client(base_url=env.addr.router_url, timeout=10) as http:
        text = http.get("/metrics").text
    handled = re.findall(r'grpc_server_handled_total\{[^}]*grpc_method="(\w+)"', text)
    assert {"AddReplica", "ListSessions", "ReleaseSession"} <= set(handled), "no fuzzed RPC counted?"
    bad = re.findall(r'grpc_server_handled_total\{[^}]*grpc_code="(UNKNOWN|INTERNAL)"[^}]*\} ([0-9.e+]+)', text)
    assert not [v for _, v in bad if float(v) > 0], bad
