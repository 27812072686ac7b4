"""Router pieces without I/O: validation/rewriting, auth, /metrics parsing, SSE usage
handling, readiness, breaker, footprint and cache-evidence arithmetic."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from services.common.errors import InvalidArgument, StartupError
from services.router.auth import Authenticator, bearer_key, hash_entry, load_keys
from services.router.core.breaker import Breaker
from services.router.core.cache import observe_usage
from services.router.core.footprint import observe_request
from services.router.core.model import TokenStats, Usage
from services.router.core.readiness import PredictionView, is_ready
from services.router.prompt_length import tokenize_request
from services.router.proxy import parse_usage, take_usage
from services.router.replicas import check_url, parse_replica_spec, parse_vllm_metrics
from services.router.validation import ParsedRequest, RequestError, check_context, parse_request

CHAT = {"model": "m", "messages": [{"role": "user", "content": "x" * 400}]}


def _err(body: object, chat: bool = True) -> RequestError:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    with pytest.raises(RequestError) as info:
        parse_request(raw, chat)
    return info.value


def test_validation_rejects_bad_bodies_with_openai_errors() -> None:
    assert _err(b"{not json").code == "invalid_json"
    assert _err(b"[1, 2]").status == 400
    deep = _err(b"[" * 100_000 + b"]" * 100_000)
    assert (deep.status, deep.code) == (400, "invalid_json") and "nested too deeply" in str(deep)
    assert _err(b'{"model": "m", "x": "\xff"}').code == "invalid_json"  # not UTF-8
    assert _err({"messages": CHAT["messages"]}).param == "model"
    assert _err({"model": 3, "messages": CHAT["messages"]}).code == "invalid_type"
    assert _err({"model": "m"}).param == "messages"
    assert _err({"model": "m", "messages": []}).param == "messages"
    assert _err({"model": "m", "messages": [{"content": "no role"}]}).param == "messages[0]"
    assert _err({**CHAT, "stream": "yes"}).param == "stream"
    assert _err({**CHAT, "max_tokens": "10"}).param == "max_tokens"
    assert _err({**CHAT, "max_tokens": 0}).param == "max_tokens"
    assert _err({**CHAT, "max_tokens": True}).param == "max_tokens"
    assert _err({**CHAT, "program_id": ["a"]}).param == "program_id"
    assert _err({**CHAT, "tao_synthetic": {"prompt_tokens": -1}}).param == "tao_synthetic.prompt_tokens"
    assert _err({"model": "m"}, chat=False).param == "prompt"
    assert _err({"model": "m", "prompt": [1, "a"]}, chat=False).param == "prompt"
    body = _err({"model": "m"}).body()
    assert set(body["error"]) == {"message", "type", "param", "code"}


def test_rewriting_strips_program_id_and_requests_usage_only_when_needed() -> None:
    raw = json.dumps(CHAT).encode()
    p = parse_request(raw, chat=True)
    assert p.upstream_body is raw and p.session_id is None and p.prompt_tokens_estimate == (400 + 16) // 4
    p = parse_request(json.dumps({**CHAT, "program_id": 7, "stream": True}).encode(), chat=True)
    up = json.loads(p.upstream_body)
    assert p.session_id == "7" and "program_id" not in up
    assert up["stream_options"] == {"include_usage": True} and not p.client_wants_usage
    p = parse_request(json.dumps({**CHAT, "extra_body": {"program_id": "p", "x": 1}}).encode(), chat=True)
    assert p.session_id == "p" and json.loads(p.upstream_body)["extra_body"] == {"x": 1}
    syn = {"session_id": "s", "prompt_tokens": 1234, "shared_prefix_id": None, "system_prompt_tokens": 10}
    p = parse_request(json.dumps({**CHAT, "tao_synthetic": syn, "max_tokens": 9}).encode(), chat=True)
    assert p.prompt_tokens_estimate == 1234 and p.max_tokens == 9
    assert json.loads(p.upstream_body)["tao_synthetic"] == syn
    p = parse_request(json.dumps({"model": "m", "prompt": [[1, 2, 3], [4]]}).encode(), chat=False)
    assert p.prompt_tokens_estimate == 3


def test_context_length_is_judged_only_on_exact_prompt_lengths() -> None:
    def parsed(extra: dict[str, object], chat: bool = True) -> object:
        body = {**CHAT, **extra} if chat else {"model": "m", **extra}
        return parse_request(json.dumps(body).encode(), chat=chat)

    syn = {"session_id": "s", "prompt_tokens": 1000}
    assert parsed({"tao_synthetic": syn}).prompt_tokens_exact
    assert parsed({"prompt": [1, 2, 3]}, chat=False).prompt_tokens_exact
    assert parsed({"prompt": [[1, 2], [3]]}, chat=False).prompt_tokens_exact
    assert not parsed({"prompt": "text"}, chat=False).prompt_tokens_exact
    assert not parsed({}).prompt_tokens_exact
    # fits: nothing raised; unknown context: nothing judged
    check_context(parsed({"tao_synthetic": syn, "max_tokens": 1048}), 2048)
    check_context(parsed({"tao_synthetic": syn, "max_tokens": 10**9}), None)
    # a character estimate is never judged on its prompt (the replica's tokenizer decides)
    check_context(parsed({"messages": [{"role": "user", "content": "x" * 100_000}]}), 2048)
    for extra in ({"tao_synthetic": syn, "max_tokens": 1049},  # 1000 + 1049 > 2048
                  {"tao_synthetic": {"session_id": "s", "prompt_tokens": 2048}},  # prompt >= context
                  {"max_tokens": 2049}):  # max_tokens alone beyond the context
        with pytest.raises(RequestError) as info:
            check_context(parsed(extra), 2048)
        assert info.value.status == 400 and info.value.code == "context_length_exceeded"


def test_tokenize_request_carries_what_changes_the_rendered_prompt() -> None:
    chat = {**CHAT, "tools": [{"type": "function"}], "add_special_tokens": True, "continue_final_message": None,
            "max_tokens": 5, "stream": True}
    assert tokenize_request(json.dumps(chat).encode(), True) == {
        "model": "m", "messages": CHAT["messages"], "add_generation_prompt": True, "tools": [{"type": "function"}],
        "add_special_tokens": True}
    assert tokenize_request(b'{"model":"m","prompt":"a b","max_tokens":3}', False) == {"model": "m", "prompt": "a b"}
    for body, is_chat in ((b'{"model":"m","prompt":["a","b"]}', False), (b'{"model":"m"}', True),
                          (b"[1]", True), (b"not json", False)):
        assert tokenize_request(body, is_chat) is None


def test_api_keys_are_hashed_and_matched(tmp_path: Path) -> None:
    path = tmp_path / "keys.yaml"
    entries = [hash_entry("A", "key-a", use_scrypt=False), hash_entry("B", "key-b", use_scrypt=True)]
    path.write_text(json.dumps({"keys": entries}))
    text = path.read_text()
    assert "key-a" not in text and "key-b" not in text
    auth = Authenticator(load_keys(path))
    assert auth.tenant_for("key-a") == "A"
    assert auth.tenant_for("key-b") == "B" and auth.tenant_for("key-b") == "B"  # second from the cache
    assert auth.tenant_for("key-c") is None and auth.tenant_for(None) is None
    assert bearer_key("Bearer abc", None) == "abc" and bearer_key("Basic abc", None) is None
    assert bearer_key(None, "xyz") == "xyz"
    bad = tmp_path / "bad.yaml"
    bad.write_text("keys:\n  - tenant: A\n    sha256: nothex\n")
    with pytest.raises(StartupError):
        load_keys(bad)


def test_vllm_metrics_parsing_and_replica_urls() -> None:
    text = (
        '# TYPE vllm:cache_config_info gauge\n'
        'vllm:cache_config_info{block_size="16",num_gpu_blocks="2000"} 1.0\n'
        'vllm:num_requests_running{engine="0",model_name="m"} 3.0\n'
        'vllm:num_requests_running{engine="1",model_name="m"} 1.0\n'
        'vllm:num_requests_waiting{engine="0",model_name="m"} 2.0\n'
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5\n'
        '# TYPE vllm:prefix_cache_hits counter\nvllm:prefix_cache_hits_total{model_name="m"} 30.0\n'
        '# TYPE vllm:prefix_cache_queries counter\nvllm:prefix_cache_queries_total{model_name="m"} 120.0\n'
    )
    m = parse_vllm_metrics(text)
    assert (m.kv_capacity_tokens, m.running, m.waiting, m.kv_cache_usage) == (32_000, 4, 2, 0.5)
    assert (m.prefix_hits, m.prefix_queries) == (30.0, 120.0)
    assert parse_replica_spec("http://h:1/") == ("h:1", "http://h:1")
    assert parse_replica_spec("gpu0=https://h:2") == ("gpu0", "https://h:2")
    for bad in ("ftp://h", "http://", "h:1", "http://h:x", "http://h?q=1"):
        with pytest.raises(InvalidArgument):
            check_url(bad)


def test_sse_usage_is_read_and_stripped_only_when_asked() -> None:
    content = b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n'
    usage_chunk = b'data: {"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":2,' \
                  b'"prompt_tokens_details":{"cached_tokens":8}}}\n\n'
    block = content + usage_chunk + b"data: [DONE]\n\n"
    kept, usage = take_usage(block, strip=True)
    assert usage == Usage(10, 2, 8)
    assert kept == content + b"data: [DONE]\n\n"
    kept, usage = take_usage(block, strip=False)
    assert kept == block and usage == Usage(10, 2, 8)
    assert parse_usage({"usage": {"prompt_tokens": 5, "completion_tokens": 1}}) == Usage(5, 1, None)
    assert parse_usage({"usage": None}) is None


def test_readiness_from_predictions() -> None:
    pred = PredictionView(False, started_at_unix_s=100.0, refreshed_at_unix_s=105.0, predicted_return_unix_s=110.0)
    assert not is_ready(pred, 105.0, acting_since_unix_s=99.9)
    assert is_ready(pred, 109.2, acting_since_unix_s=99.9)  # within the 1 s horizon
    assert not is_ready(pred, 140.0, acting_since_unix_s=99.9)  # stale (> 30 s)
    assert not is_ready(pred, 109.5, acting_since_unix_s=104.0)  # for an older tool call
    flagged = PredictionView(True, 100.0, 105.0, 500.0)
    assert is_ready(flagged, 106.0, None)


def test_breaker_opens_and_only_a_probe_closes_it() -> None:
    b = Breaker(threshold=2, open_s=5.0)
    b = b.failure(1.0)
    assert not b.is_open
    b = b.success().failure(2.0)
    assert not b.is_open  # success reset the count
    b = b.failure(3.0)
    assert b.is_open and b.success().is_open
    assert b.probe_ok(4.0).is_open  # open for less than open_s
    assert not b.probe_ok(8.5).is_open


def test_token_stats_and_evidence_arithmetic() -> None:
    t = observe_request(TokenStats(), 1000, 100, alpha=0.5)
    assert t.context_tokens == 1100 and t.ewma_append_tokens == 0 and t.ewma_output_tokens == 100
    t = observe_request(t, 1300, 50, alpha=0.5)
    assert t.ewma_append_tokens == 200 and t.ewma_output_tokens == 75
    t = observe_request(t, 1400, 50, alpha=0.5)  # append 50 -> 0.5*50 + 0.5*200
    assert t.ewma_append_tokens == 125
    ev = observe_usage((), "r0", Usage(1000, 100, None), False, 1.0)
    assert ev[0].kind == "volume" and ev[0].processed_tokens == 1100
    ev = observe_usage(ev, "r0", Usage(1300, 50, None), False, 2.0)
    assert ev[0].processed_tokens == 2450 and ev[0].volume_tokens == 1350  # bounded by the context
    ev = observe_usage(ev, "r1", Usage(1300, 50, 0), False, 3.0)
    assert {e.replica: e.kind for e in ev} == {"r0": "volume", "r1": "cached_tokens"}


def test_the_shared_prefix_is_read_off_the_model_the_tools_and_the_leading_system_messages() -> None:
    def parsed(messages: list[dict[str, object]], **extra: object) -> ParsedRequest:
        return parse_request(json.dumps({"model": "m", "messages": messages, **extra}).encode(), chat=True)

    system = {"role": "system", "content": "You are a coding agent. " * 50}
    a = parsed([system, {"role": "user", "content": "fix the parser"}])
    b = parsed([system, {"role": "user", "content": "add a test"}, {"role": "assistant", "content": "ok"}])
    assert a.prefix_key and a.prefix_key == b.prefix_key  # two sessions of one agent share it
    assert a.prefix_tokens == (len(system["content"]) + 16) // 4  # estimated like the prompt
    assert parsed([{**system, "content": "You are a reviewer."}, {"role": "user", "content": "x"}]).prefix_key \
        != a.prefix_key
    tools = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
    with_tools = parsed([system, {"role": "user", "content": "x"}], tools=tools)
    assert with_tools.prefix_key != a.prefix_key
    assert with_tools.prefix_tokens == a.prefix_tokens + len(json.dumps(tools, separators=(",", ":"))) // 4
    developer = parsed([system, {"role": "developer", "content": "Be brief."}, {"role": "user", "content": "x"}])
    assert developer.prefix_key != a.prefix_key and developer.prefix_tokens > a.prefix_tokens
    assert parse_request(json.dumps({"model": "n", "messages": [system]}).encode(), True).prefix_key != a.prefix_key
    none = parsed([{"role": "user", "content": "x"}, system])  # nothing before the first user turn
    assert (none.prefix_key, none.prefix_tokens) == ("", 0)
    assert parse_request(json.dumps({"model": "m", "prompt": "x" * 400}).encode(), chat=False).prefix_key == ""
    syn = {"session_id": "s", "prompt_tokens": 5000, "shared_prefix_id": "swe", "system_prompt_tokens": 3000}
    p = parsed([{"role": "user", "content": "x"}], tao_synthetic=syn)
    assert (p.prefix_key, p.prefix_tokens) == ("synthetic:swe", 3000)
    p = parsed([{"role": "user", "content": "x"}], tao_synthetic={**syn, "shared_prefix_id": None})
    assert (p.prefix_key, p.prefix_tokens) == ("", 0)
