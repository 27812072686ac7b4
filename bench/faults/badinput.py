"""Bad input against live services, shared by ``tests/badinput`` and ``tao check faults``.

HTTP: a catalogue of hostile requests for every endpoint of the router and of an emulated
replica (malformed JSON, wrong types, huge bodies, huge ``max_tokens``, invalid UTF-8,
missing or unknown model, unknown sessions, wrong methods and paths), each with the status
the service documents (router: services/router/README.md; replica: vLLM's OpenAI server).
gRPC: every RPC of tao.{planner,predictor,budget,router}.v1 called with hypothesis-generated
hostile messages (``bench.faults.protofuzz``).

Verdicts: ``rejected`` (a documented error: OpenAI-style body for HTTP, a documented status
code for gRPC), ``accepted`` (valid after all), ``crash`` (HTTP 500 or no answer; gRPC
UNKNOWN / INTERNAL / no answer) or ``unexpected`` (an answer, but not the documented one).
A state probe before and after each rejected input must read the same (no state change).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import httpx
from google.protobuf import message_factory
from google.protobuf.message import Message

from services.common import keys
from services.common.extras import require
from services.predictor import store as predictor_store
from tao.budget.v1 import budget_pb2
from tao.planner.v1 import planner_pb2
from tao.predictor.v1 import predictor_pb2
from tao.router.v1 import router_pb2

#: the gRPC codes docs/architecture.md#failure-modes-and-degraded-behaviour and the protos
#: document for rejected input
CLEAN_CODES = frozenset({
    grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.OUT_OF_RANGE,
})
#: how our own client ends an open server stream
STREAM_CUT_CODES = frozenset({grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED})
CRASH_CODES = frozenset({grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL})


@dataclass
class Tally:
    """What happened to the bad inputs of one run."""

    tried: int = 0
    rejected: int = 0
    accepted: int = 0
    crashes: int = 0
    unexpected: int = 0
    state_changes: int = 0
    problems: list[str] = field(default_factory=list)

    def add(self, verdict: str, problem: str | None = None, state_changed: bool = False) -> None:
        self.tried += 1
        setattr(self, verdict, getattr(self, verdict) + 1)
        if state_changed:
            self.state_changes += 1
        if problem and len(self.problems) < 50:
            self.problems.append(problem)

    def merge(self, other: Tally) -> None:
        for name in ("tried", "rejected", "accepted", "crashes", "unexpected", "state_changes"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.problems.extend(other.problems[: max(0, 50 - len(self.problems))])


# ------------------------------------------------------------------------------ HTTP


@dataclass(frozen=True)
class HttpCase:
    name: str
    method: str
    path: str
    body: bytes | None = None
    headers: tuple[tuple[str, str], ...] = ()
    #: documented statuses
    expect: tuple[int, ...] = (400,)
    #: an error must carry an OpenAI-style body {"error": {"message", "type", ...}}
    openai_error: bool = True


def _j(obj: Any) -> bytes:
    return json.dumps(obj).encode()


def completion_cases(model: str, *, body_limit: int | None, router: bool) -> list[HttpCase]:
    """Bad requests for /v1/chat/completions and /v1/completions (router and replica)."""
    msgs = [{"role": "user", "content": "hello"}]
    chat = {"model": model, "messages": msgs, "max_tokens": 4}
    comp = {"model": model, "prompt": "hello", "max_tokens": 4}
    cases: list[HttpCase] = []
    for path, good, field_name in (("/v1/chat/completions", chat, "messages"), ("/v1/completions", comp, "prompt")):
        kind = "chat" if "chat" in path else "completions"

        def c(name: str, body: bytes | dict[str, Any], expect: tuple[int, ...] = (400,),
              headers: tuple[tuple[str, str], ...] = (), path: str = path, kind: str = kind) -> None:
            full = f"{kind}: {name}"
            if isinstance(body, dict):  # the case's name as `user`: taps see which case reached a replica
                body = _j({**body, "user": full})
            cases.append(HttpCase(full, "POST", path, body, headers, expect))

        c("malformed JSON", b'{"model": ')
        c("JSON not an object", b"[1, 2, 3]")
        c("invalid UTF-8", b'{"model": "\xff\xfe", "' + field_name.encode() + b'": "x"}')
        c("deeply nested JSON", b"[" * 100_000 + b"]" * 100_000)
        # vLLM serves its one model when `model` is absent (protocol.py: model: Optional[str] = None);
        # the router needs it to pick replicas (README: 400)
        c("missing model", {k: v for k, v in good.items() if k != "model"}, (400,) if router else (200,))
        c("model of the wrong type", {**good, "model": 5})
        c("unknown model", {**good, "model": "no-such-model"}, (404,))
        c(f"{field_name} of the wrong type", {**good, field_name: {"a": 1}})
        c(f"missing {field_name}", {k: v for k, v in good.items() if k != field_name})
        c("max_tokens a string", {**good, "max_tokens": "10"})
        c("max_tokens negative", {**good, "max_tokens": -1})
        c("huge max_tokens", {**good, "max_tokens": 10**12}, headers=(("x-session-id", f"bad-huge-{kind}"),))
        c("max_tokens beyond int64", {**good, "max_tokens": 2**70})
        c("stream not a boolean", {**good, "stream": "yes"})
        c("stream_options not an object", {**good, "stream": True, "stream_options": [1]})
        c("n of the wrong type", {**good, "n": "two"})
        c("tao_synthetic not an object", {**good, "tao_synthetic": 3})
        c("tao_synthetic prompt_tokens negative", {**good, "tao_synthetic": {"session_id": "s", "prompt_tokens": -4}})
        c("prompt longer than the model context",
          {**good, "tao_synthetic": {"session_id": "bad-long", "prompt_tokens": 10**9}},
          headers=(("x-session-id", f"bad-long-{kind}"),))
        words = "word " * ((900_000 if body_limit is None else body_limit - 4096) // 5)
        long_field = [{"role": "user", "content": words}] if field_name == "messages" else words
        c("huge prompt (context too long)", {**good, field_name: long_field})
        if body_limit is not None:
            c("body over the size limit", {**good, "pad": "x" * (body_limit + 1024)}, (413,))
        if router:
            c("x-session-id too long", good, headers=(("x-session-id", "s" * 300),))
            c("program_id of the wrong type", {**good, "program_id": [1]})
            c("program_id not printable", {**good, "program_id": "a\u0000b"})
            c("extra_body not an object", {**good, "extra_body": "x"})
        # aiohttp's own 405 for the replica (vLLM/FastAPI answers {"detail": ...}, not OpenAI-style)
        cases.append(HttpCase(f"{kind}: wrong method", "GET", path, None, (), (405,), openai_error=router))
    return cases


def router_cases(model: str, body_limit: int) -> list[HttpCase]:
    cases = completion_cases(model, body_limit=body_limit, router=True)
    cases += [
        HttpCase("release: unknown session", "POST", "/v1/sessions/no-such-session/release", None, (), (404,)),
        HttpCase("release: session id too long", "POST", f"/v1/sessions/{'s' * 300}/release", None, (), (400,)),
        HttpCase("release: forced, unknown session", "POST", "/v1/sessions/nope/release?force=true", None, (), (404,)),
        HttpCase("programs/release: malformed JSON", "POST", "/programs/release", b"{", (), (400,)),
        HttpCase("programs/release: deeply nested JSON", "POST", "/programs/release",
                 b"[" * 100_000 + b"]" * 100_000, (), (400,)),
        HttpCase("programs/release: missing program_id", "POST", "/programs/release", _j({}), (), (400,)),
        HttpCase("programs/release: program_id of the wrong type", "POST", "/programs/release",
                 _j({"program_id": {"a": 1}}), (), (400,)),
        # ThunderAgent's API answers an unknown program with released=false, not an error
        HttpCase("programs/release: unknown program", "POST", "/programs/release", _j({"program_id": "nope"}), (),
                 (200,)),
        HttpCase("models: wrong method", "POST", "/v1/models", b"{}", (), (405,)),
        HttpCase("health: junk query", "GET", "/health?x=%ff%fe&&=", None, (), (200,)),
        HttpCase("models: junk query", "GET", "/v1/models?limit=-1", None, (), (200,)),
        HttpCase("metrics: wrong method", "DELETE", "/metrics", None, (), (405,)),
        HttpCase("unknown path", "GET", "/v2/nothing-here", None, (), (404,)),
    ]
    return cases


def replica_cases(model: str) -> list[HttpCase]:
    # vllm-sim accepts bodies up to 256 MiB (vLLM has no limit): a huge body is tested as a
    # prompt over the context length instead of sending hundreds of megabytes
    cases = completion_cases(model, body_limit=None, router=False)
    cases += [
        HttpCase("models: wrong method", "POST", "/v1/models", b"{}", (), (405,), openai_error=False),
        HttpCase("health: junk query", "GET", "/health?x=%ff", None, (), (200,)),
        HttpCase("unknown path", "GET", "/v2/nothing-here", None, (), (404,), openai_error=False),
    ]
    return cases


def _openai_error(raw: bytes) -> bool:
    try:
        err = json.loads(raw).get("error")
    except (ValueError, AttributeError):
        return False
    return isinstance(err, dict) and isinstance(err.get("message"), str) and isinstance(err.get("type"), str)


def http_verdict(case: HttpCase, status: int | None, raw: bytes) -> tuple[str, str | None]:
    if status is None:
        return "crashes", f"{case.name}: no answer"
    if status == 500:
        return "crashes", f"{case.name}: 500 {raw[:120]!r}"
    if status not in case.expect:
        return "unexpected", f"{case.name}: expected {case.expect}, got {status} {raw[:120]!r}"
    if status >= 400:
        if case.openai_error and not _openai_error(raw):
            return "unexpected", f"{case.name}: {status} without an OpenAI-style error body: {raw[:120]!r}"
        return "rejected", None
    return "accepted", None


def run_http(client: httpx.Client, cases: list[HttpCase], tally: Tally,
             probe: Callable[[], Any] | None = None, settle_s: float = 0.0,
             on_result: Callable[[HttpCase, int | None, str, bool], None] | None = None) -> None:
    """Send every case; rejected cases must leave ``probe()`` unchanged."""
    for case in cases:
        before = probe() if probe else None
        status: int | None
        try:
            resp = client.request(case.method, case.path, content=case.body, headers=dict(case.headers))
            status, raw = resp.status_code, resp.content
        except httpx.HTTPError as exc:
            status, raw = None, str(exc).encode()
        verdict, problem = http_verdict(case, status, raw)
        changed = False
        if probe is not None and verdict == "rejected":
            if settle_s:
                time.sleep(settle_s)
            after = probe()
            changed = after != before
            if changed:
                problem = f"{case.name}: state changed: {before} -> {after}"
        tally.add(verdict, problem, changed)
        if on_result is not None:
            on_result(case, status, verdict, changed)


# ------------------------------------------------------------------------------ gRPC


@dataclass(frozen=True)
class RpcTarget:
    service: str  # planner | predictor | budget | router
    method: str  # /package.Service/Method
    request: type[Message]
    response: type[Message]
    client_streaming: bool
    server_streaming: bool
    mutating: bool

    @property
    def name(self) -> str:
        return self.method.rsplit("/", 1)[1]


MUTATING = {"ConfigureTenants", "SetPolicy", "ReportDemand", "StreamToolEvents", "ReportToolEvents",
            "ReleaseSession", "AddReplica", "DrainReplica"}


def rpc_targets() -> list[RpcTarget]:
    """Every RPC of the four services, from their descriptors."""
    out = []
    for service, module, name in (("planner", planner_pb2, "PlannerService"),
                                  ("predictor", predictor_pb2, "PredictorService"),
                                  ("budget", budget_pb2, "BudgetService"),
                                  ("router", router_pb2, "RouterAdminService")):
        svc = module.DESCRIPTOR.services_by_name[name]
        for m in svc.methods:
            out.append(RpcTarget(service, f"/{svc.full_name}/{m.name}",
                                 message_factory.GetMessageClass(m.input_type),
                                 message_factory.GetMessageClass(m.output_type),
                                 m.client_streaming, m.server_streaming, m.name in MUTATING))
    return out


def call_rpc(channel: grpc.Channel, t: RpcTarget, msg: Message, timeout_s: float = 10.0) -> grpc.StatusCode:
    """Call ``t`` with ``msg``; server streams are read for up to 0.3 s (or 2 messages)."""
    ser, de = t.request.SerializeToString, t.response.FromString
    try:
        if not t.client_streaming and not t.server_streaming:
            channel.unary_unary(t.method, request_serializer=ser, response_deserializer=de)(msg, timeout=timeout_s)
            return grpc.StatusCode.OK
        if t.client_streaming:
            stream = channel.stream_stream(t.method, request_serializer=ser, response_deserializer=de)(
                iter([msg]), timeout=timeout_s)
        else:
            stream = channel.unary_stream(t.method, request_serializer=ser, response_deserializer=de)(
                msg, timeout=0.3)
        for i, _ in enumerate(stream):
            if i >= 1:
                stream.cancel()
                break
        return grpc.StatusCode.OK
    except grpc.RpcError as exc:
        code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
        if code in STREAM_CUT_CODES and t.server_streaming:
            return grpc.StatusCode.OK  # our own cut of an open stream
        return code


def grpc_verdict(code: grpc.StatusCode) -> str:
    if code == grpc.StatusCode.OK:
        return "accepted"
    if code in CLEAN_CODES:
        return "rejected"
    if code in CRASH_CODES:
        return "crashes"
    return "unexpected"


def call_and_judge(channel: grpc.Channel, t: RpcTarget, msg: Message) -> str:
    """The verdict of one call (predictor ingestion that acks every event REJECTED counts as
    a rejection, though the RPC itself succeeds)."""
    if t.name == "ReportToolEvents":
        try:
            reply = channel.unary_unary(t.method, request_serializer=t.request.SerializeToString,
                                        response_deserializer=t.response.FromString)(msg, timeout=10)
        except grpc.RpcError as exc:
            return grpc_verdict(exc.code())
        rejected = predictor_pb2.ACK_STATUS_REJECTED
        return "rejected" if reply.acks and all(a.status == rejected for a in reply.acks) else "accepted"
    return grpc_verdict(call_rpc(channel, t, msg))


def fuzz_rpc(channel: grpc.Channel, t: RpcTarget, examples: int, tally: Tally,
             probe: Callable[[], Any] | None = None, strict: bool = False, seed: int = 0,
             base: Message | None = None) -> None:
    """Call ``t`` with ``examples`` hostile messages: arbitrary ones, or (``base``) one or two
    hostile edits away from that valid request. Rejected mutations must leave ``probe()``
    unchanged. ``strict``: raise AssertionError at the first crash, unexpected code or state
    change (hypothesis then shrinks it to a minimal message). Needs the 'faults' extra."""
    require("faults", "gRPC fuzzing")
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hseed

    from bench.faults.protofuzz import messages, near

    phases = [Phase.explicit, Phase.generate] + ([Phase.shrink] if strict else [])
    strategy = near(base) if base is not None else messages(t.request.DESCRIPTOR, t.request)

    @hseed(seed)
    @settings(max_examples=examples, deadline=None, database=None, phases=phases,
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def one(msg: Message) -> None:
        before = probe() if probe is not None and t.mutating else None
        verdict = call_and_judge(channel, t, msg)
        changed = False
        problem = None if verdict in ("accepted", "rejected") else f"{t.service}.{t.name}: {verdict}"
        if verdict == "rejected" and probe is not None and t.mutating:
            after = probe()
            changed = after != before
            if changed:
                problem = f"{t.service}.{t.name}: rejected but state changed: {before} -> {after}"
        tally.add(verdict, problem, changed)
        if strict and problem is not None:
            raise AssertionError(f"{problem}; message: {_short(msg)}")

    one()


def baselines(time_scale: float) -> dict[str, Message]:
    """A valid request per RPC (by method name), the starting point of near-valid fuzzing."""
    now = time.time() * time_scale
    event = predictor_pb2.ToolEvent(session_id="fz-session", call_id="fz-call", sequence=0,
                                    type=predictor_pb2.TOOL_EVENT_TYPE_STARTED, tool="bash", command="sleep 2",
                                    t_unix_s=now, deadline_s=30.0)
    snapshot = planner_pb2.Snapshot(
        now_s=100.0,
        replicas=[planner_pb2.Replica(id="r0", capacity_tokens=10_000, used_tokens=1_000, healthy=True),
                  planner_pb2.Replica(id="r1", capacity_tokens=10_000, used_tokens=0, healthy=True)],
        sessions=[planner_pb2.Session(id=f"s{i}", tenant="default", footprint_tokens=2_000 + i, ready=i % 2 == 0,
                                      credits=[planner_pb2.Credit(replica="r0", tokens=500, observed_at_s=99.0,
                                                                  kind="cached_tokens")])
                  for i in range(3)],
        tenant_headroom={"default": 4})
    return {
        "SolveSnapshot": planner_pb2.SolveSnapshotRequest(snapshot=snapshot, policy="tao"),
        "ExplainSession": planner_pb2.ExplainSessionRequest(session_id="s0"),
        "ReportToolEvents": predictor_pb2.ReportToolEventsRequest(runner_id="fuzz", events=[event]),
        "StreamToolEvents": predictor_pb2.StreamToolEventsRequest(runner_id="fuzz", events=[event]),
        "GetPrediction": predictor_pb2.GetPredictionRequest(session_id="fz-session"),
        "WatchReadiness": predictor_pb2.WatchReadinessRequest(session_ids=["fz-session"], initial=True),
        "ConfigureTenants": budget_pb2.ConfigureTenantsRequest(
            total_budget=6, tenants=[budget_pb2.TenantConfig(name="default", floor=1, weight=1.0)]),
        "SetPolicy": budget_pb2.SetPolicyRequest(policy="dynamic"),
        "ReportDemand": budget_pb2.ReportDemandRequest(
            demand=[budget_pb2.TenantDemand(tenant="default", waiting=1, in_flight=1, p99_latency_s=0.5)]),
        "ListSessions": router_pb2.ListSessionsRequest(tenant="default", limit=10),
        "ReleaseSession": router_pb2.ReleaseSessionRequest(session_id="fz-unknown"),
        "AddReplica": router_pb2.AddReplicaRequest(id="fz-replica", url="http://127.0.0.1:9", kv_capacity_tokens=1000),
        "DrainReplica": router_pb2.DrainReplicaRequest(id="fz-unknown"),
    }


def _short(msg: Message) -> str:
    text = str(msg)
    return text if len(text) < 600 else text[:600] + f"... ({len(text)} chars)"


def targets_by_service(targets: list[RpcTarget]) -> Iterator[tuple[str, list[RpcTarget]]]:
    for service in ("planner", "predictor", "budget", "router"):
        yield service, [t for t in targets if t.service == service]


# ------------------------------------------------------------------------------ state probes


def budget_state(redis: Any) -> tuple[Any, ...]:
    """The budget configuration as stored (without epoch and revision)."""
    raw = redis.get(keys.BUDGET_CONFIG)
    if raw is None:
        return ()
    cfg = json.loads(raw)
    tenants = tuple(sorted((t["name"], t.get("floor"), t.get("weight"), t.get("static_cap")) for t in cfg["tenants"]))
    return cfg["total_budget"], tenants, cfg["policy"]


def predictor_state(redis: Any) -> tuple[Any, ...]:
    """Sessions the predictor holds state or predictions for."""
    return tuple(sorted(redis.hkeys(keys.PREDICTIONS))), tuple(sorted(redis.hkeys(predictor_store.STATE)))


def router_state(channel: grpc.Channel) -> tuple[Any, ...]:
    """Replicas (id, url, draining) and session ids as the router's admin API reports them."""
    list_replicas = channel.unary_unary("/tao.router.v1.RouterAdminService/ListReplicas",
                                        request_serializer=router_pb2.ListReplicasRequest.SerializeToString,
                                        response_deserializer=router_pb2.ListReplicasResponse.FromString)
    list_sessions = channel.unary_unary("/tao.router.v1.RouterAdminService/ListSessions",
                                        request_serializer=router_pb2.ListSessionsRequest.SerializeToString,
                                        response_deserializer=router_pb2.ListSessionsResponse.FromString)
    reps = list_replicas(router_pb2.ListReplicasRequest(), timeout=5).replicas
    sessions = list_sessions(router_pb2.ListSessionsRequest(), timeout=5).sessions
    return tuple((r.id, r.url, r.draining) for r in reps), tuple(s.session_id for s in sessions)


def fuzz_all(addresses: dict[str, str], redis: Any, time_scale: float, examples: int, tally: Tally,
             strict: bool = False, only: str | None = None,
             on_target: Callable[[RpcTarget, Tally], None] | None = None) -> None:
    """Fuzz every RPC (random and near-valid messages); ``addresses``: service -> host:port.
    Restores the budget configuration afterwards."""
    base = baselines(time_scale)
    options = [("grpc.max_send_message_length", 64 << 20), ("grpc.max_receive_message_length", 64 << 20)]
    channels = {name: grpc.insecure_channel(addr, options=options) for name, addr in addresses.items()}
    probes: dict[str, Callable[[], Any]] = {
        "budget": lambda: budget_state(redis),
        "predictor": lambda: predictor_state(redis),
        "router": lambda: router_state(channels["router"]),
    }
    saved = redis.get(keys.BUDGET_CONFIG)
    try:
        for t in rpc_targets():
            if only is not None and t.service != only:
                continue
            one = Tally()
            n = max(1, examples // 4) if t.server_streaming else examples
            fuzz_rpc(channels[t.service], t, n, one, probes.get(t.service), strict)
            if t.name in base:
                fuzz_rpc(channels[t.service], t, n, one, probes.get(t.service), strict, seed=1, base=base[t.name])
            tally.merge(one)
            if on_target is not None:
                on_target(t, one)
    finally:
        if saved is not None and "budget" in channels:
            cfg = json.loads(saved)
            request = budget_pb2.ConfigureTenantsRequest(total_budget=cfg["total_budget"], tenants=[
                budget_pb2.TenantConfig(name=t["name"], floor=t.get("floor", 0), weight=t.get("weight", 1.0),
                                        p99_slo_s=t.get("p99_slo_s", 0.0), static_cap=t.get("static_cap", 0))
                for t in cfg["tenants"]])
            with contextlib.suppress(grpc.RpcError):
                channels["budget"].unary_unary(
                    "/tao.budget.v1.BudgetService/ConfigureTenants",
                    request_serializer=budget_pb2.ConfigureTenantsRequest.SerializeToString,
                    response_deserializer=budget_pb2.ConfigureTenantsResponse.FromString)(request, timeout=5)
        for ch in channels.values():
            ch.close()
