"""Access at the router (docs/architecture.md#security): per-tenant API keys stored hashed and compared in
constant time; health exempt; tenants isolated; and no client key ever reaches a replica
(a recording tap in front of the replica asserts what it receives: every header and body)."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
import redis.asyncio as aioredis

from bench.faults.tap import ReplicaTap, TapLog
from services.common import keys
from services.common.settings import load_settings
from services.common.testing import serve_in_process
from services.router import auth
from services.router.server import RouterApp, Settings
from services.sim.vllm_sim.server import start_vllm_sim
from tao.router.v1 import router_pb2, router_pb2_grpc

KEY_A = "sk-tenant-a-0123456789abcdef"
KEY_B = "sk-tenant-b-fedcba9876543210"
UPSTREAM = "upstream-secret-for-replicas"
MODEL = "Qwen/Qwen3-32B"


@dataclass
class Gateway:
    url: str
    admin: str
    tap: TapLog
    keys_file: Path


def _chat(session: str, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": False,
            "program_id": session, **extra}


@pytest.fixture
async def gateway(redis_url: str, tmp_path: Path) -> AsyncIterator[Gateway]:
    keys_file = tmp_path / "keys.yaml"
    entries = [auth.hash_entry("A", KEY_A, use_scrypt=False), auth.hash_entry("B", KEY_B, use_scrypt=True)]
    keys_file.write_text(json.dumps({"keys": entries}))
    async with start_vllm_sim(time_scale=200.0) as sim:
        log = TapLog()
        tap = await ReplicaTap("r0", "127.0.0.1", sim.port, log).start()
        try:
            settings = load_settings(Settings, redis_url=redis_url, port=0, http_port=0,
                                     replicas=[f"r0=http://127.0.0.1:{tap.port}"], policy="round_robin",
                                     api_keys_file=keys_file, upstream_api_key=UPSTREAM, health_interval_s=0.1,
                                     flush_interval_s=0.005, redis_startup_timeout_s=2.0)
            app = RouterApp(settings)
            async with serve_in_process("router", app, settings) as running:
                async with httpx.AsyncClient(base_url=app.base_url, timeout=10) as http:
                    for _ in range(100):
                        if (await http.get("/health")).status_code == 200:
                            break
                        await asyncio.sleep(0.05)
                yield Gateway(app.base_url, running.address, log, keys_file)
        finally:
            await tap.stop()


def test_keys_file_holds_only_hashes(tmp_path: Path) -> None:
    entries = [auth.hash_entry("A", KEY_A, use_scrypt=False), auth.hash_entry("B", KEY_B, use_scrypt=True)]
    text = json.dumps(entries)
    assert KEY_A not in text and KEY_B not in text
    assert entries[0]["sha256"] == hashlib.sha256(KEY_A.encode()).hexdigest()
    assert entries[1]["scrypt"].startswith("scrypt$")


def test_authenticator_keeps_no_plaintext_and_compares_every_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    others = [auth.parse_entry(auth.hash_entry(f"t{i}", f"other-key-{i}", use_scrypt=False), "test") for i in range(7)]
    a = auth.parse_entry(auth.hash_entry("A", KEY_A, use_scrypt=False), "test")
    b = auth.parse_entry(auth.hash_entry("B", KEY_B, use_scrypt=True), "test")
    authenticator = auth.Authenticator([a, *others, b])
    calls: list[int] = []
    real = hmac.compare_digest

    def counting(x: bytes, y: bytes) -> bool:
        calls.append(1)
        return bool(real(x, y))

    monkeypatch.setattr(hmac, "compare_digest", counting)  # the module services.router.auth calls
    assert authenticator.tenant_for(KEY_A) == "A"
    assert len(calls) == 8, "the match on the first entry must not end the comparison early"
    calls.clear()
    assert authenticator.tenant_for("wrong-key") is None
    assert len(calls) == 9  # every sha256 entry, then the scrypt one
    assert authenticator.tenant_for(KEY_B) == "B"
    assert authenticator.tenant_for(KEY_B) == "B"  # cached by digest
    blob = repr(vars(authenticator)).encode()
    assert KEY_A.encode() not in blob and KEY_B.encode() not in blob


async def test_api_keys_tenants_and_health(gateway: Gateway) -> None:
    async with httpx.AsyncClient(base_url=gateway.url, timeout=10) as http:
        health = await http.get("/health")
        assert health.status_code == 200  # exempt: probes carry no key
        for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": f"Basic {KEY_A}"},
                        {"api-key": "nope"}):
            r = await http.post("/v1/chat/completions", json=_chat("s-x"), headers=headers)
            assert r.status_code == 401, (headers, r.text)
            assert r.json()["error"]["code"] == "invalid_api_key"
        assert (await http.get("/v1/models")).status_code == 401
        ok_a = await http.post("/v1/chat/completions", json=_chat("s-a"), headers={"Authorization": f"Bearer {KEY_A}"})
        assert ok_a.status_code == 200, ok_a.text
        ok_b = await http.post("/v1/chat/completions", json=_chat("s-b", stream=True), headers={"api-key": KEY_B})
        assert ok_b.status_code == 200 and b"[DONE]" in ok_b.content
        # tenant isolation: B can neither use nor release A's session
        steal = await http.post("/v1/chat/completions", json=_chat("s-a"), headers={"api-key": KEY_B})
        assert steal.status_code == 409, steal.text
        release = await http.post("/v1/sessions/s-a/release", headers={"api-key": KEY_B})
        assert release.status_code == 404
    async with grpc.aio.insecure_channel(gateway.admin) as ch:
        sessions = await router_pb2_grpc.RouterAdminServiceStub(ch).ListSessions(router_pb2.ListSessionsRequest(),
                                                                                timeout=5)
    assert {(s.session_id, s.tenant) for s in sessions.sessions} >= {("s-a", "A"), ("s-b", "B")}


async def test_no_client_key_reaches_a_replica(gateway: Gateway, redis_url: str) -> None:
    async with httpx.AsyncClient(base_url=gateway.url, timeout=10) as http:
        for i, headers in enumerate(({"Authorization": f"Bearer {KEY_A}"}, {"api-key": KEY_B},
                                     {"Authorization": f"Bearer {KEY_A}", "api-key": KEY_B})):
            r = await http.post("/v1/chat/completions", json=_chat(f"s-{i}", stream=i % 2 == 1), headers=headers)
            assert r.status_code == 200, r.text
            r = await http.post("/v1/completions", headers=headers, json={
                "model": MODEL, "prompt": "hello", "max_tokens": 3, "extra_body": {"program_id": f"p-{i}"}})
            assert r.status_code == 200, r.text
    received = gateway.tap.receptions
    completions = [r for r in received if r.is_completion]
    assert len(completions) == 6
    for rec in received:  # completions, and the router's own health probes and scrapes
        dump = json.dumps(rec.headers)
        assert KEY_A not in dump and KEY_B not in dump, rec.headers
        assert "api-key" not in rec.headers
    for rec in completions:
        assert rec.headers.get("authorization") == f"Bearer {UPSTREAM}"
    client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        for key in await client.keys(f"{keys.PREFIX}:*"):
            kind = await client.type(key)
            values = [await client.get(key)] if kind == "string" else \
                list((await client.hgetall(key)).values()) if kind == "hash" else []
            for v in values:
                assert KEY_A not in (v or "") and KEY_B not in (v or ""), key
    finally:
        await client.aclose()
