"""bench.peers: system parsing, router command lines, table and verdict (pure parts only; the
benchmark itself is not run as a test)."""

from __future__ import annotations

import pytest

from bench.peers.__main__ import parse
from bench.peers.core import (
    DEFAULT_SYSTEMS,
    DYNAMO_SCRIPT,
    HEADERS,
    System,
    dynamo_kv_args,
    kv_event_router_args,
    markdown_table,
    parse_system,
    parse_systems,
    router_argv,
    spread_pct,
    table_rows,
    verdict,
)


def test_parse_systems_expands_and_validates() -> None:
    names = [s.name for s in parse_systems("default")]
    assert names == list(DEFAULT_SYSTEMS)
    assert "floor" in names and "tao:tao" in names and "vllm-router:consistent_hash" in names
    assert [s.name for s in parse_systems("floor, tao:sjf", ["tao", "sjf"])] == ["floor", "tao:sjf"]
    assert parse_system("vllm-router:program") == System("vllm-router", "program")
    for bad in ("vllm-router:nope", "sglang-router:consistent_hash", "haproxy:rr", "tao", "tao:oracle", ""):
        with pytest.raises(ValueError):
            parse_systems(bad, ["tao", "oracle"])
    with pytest.raises(ValueError, match="more than once"):
        parse_systems("floor,default")


def test_cli_defaults_and_errors() -> None:
    args = parse([])
    assert (args.sessions, args.repeat, args.time_scale, args.replicas, args.num_gpu_blocks) == (12, 2, 20.0, 2, 6000)
    assert [s.name for s in args.system_list] == list(DEFAULT_SYSTEMS)
    for bad in (["--sessions", "0"], ["--systems", "tao:nope"], ["--time-scale", "-1"], ["--profile", "x"]):
        with pytest.raises(SystemExit):
            parse(bad)


def test_router_argv() -> None:
    reps = ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    v = router_argv(System("vllm-router", "consistent_hash"), "/venv/bin", 9000, reps, 9001)
    assert v[0] == "/venv/bin/vllm-router" and v[v.index("--policy") + 1] == "consistent_hash"
    assert v[v.index("--worker-urls") + 1: v.index("--worker-urls") + 3] == reps
    assert v[v.index("--prometheus-port") + 1] == "9001" and v[v.index("--port") + 1] == "9000"
    p = router_argv(System("vllm-router", "program"), "/b", 1, reps, 2)
    assert "--enable-program-scheduling" in p and "--policy" not in p
    s = router_argv(System("sglang-router", "cache_aware"), "/b", 1, reps, 2)
    assert s[:2] == ["/b/sglang-router", "launch"]
    f = router_argv(System("floor"), "/b", 7, reps, 8, python="py")
    assert f[:3] == ["py", "-m", "bench.peers.rrproxy"] and f.count("--replica") == 2
    with pytest.raises(ValueError):
        router_argv(System("tao", "tao"), "/b", 1, reps, 2)


def test_kv_aware_gets_the_replicas_kv_event_sources() -> None:
    reps = ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    kv = System("vllm-router", "kv_aware")
    assert kv.needs_kv_events and "vllm-router:kv_aware" in DEFAULT_SYSTEMS
    assert not System("vllm-router", "cache_aware").needs_kv_events and not System("tao", "tao").needs_kv_events
    sources = {reps[0]: {"data_parallel_rank": 0, "endpoint": "tcp://127.0.0.1:5001",
                         "replay_endpoint": "tcp://127.0.0.1:5002", "topic": ""},
               reps[1]: {"data_parallel_rank": 0, "endpoint": "tcp://127.0.0.1:5003", "replay_endpoint": None,
                         "topic": ""}}
    args = kv_event_router_args(sources, "Qwen/Qwen3-32B", 16)
    assert args == ["--kv-event-source", "http://127.0.0.1:1=tcp://127.0.0.1:5001",
                    "--kv-event-replay-source", "http://127.0.0.1:1=tcp://127.0.0.1:5002",
                    "--kv-event-source", "http://127.0.0.1:2=tcp://127.0.0.1:5003",
                    "--kv-event-model", "Qwen/Qwen3-32B", "--kv-event-block-size", "16"]
    v = router_argv(kv, "/b", 1, reps, 2, kv_args=args)
    assert v[v.index("--policy") + 1] == "kv_aware" and v[-len(args):] == args
    with pytest.raises(ValueError, match="KV-event sources"):
        router_argv(kv, "/b", 1, reps, 2)


def _run(lat: float, ttft: float, errors: int = 0) -> dict[str, object]:
    return {"mean_task_latency_s": lat, "p90_task_latency_s": lat * 1.5, "mean_ttft_s": ttft,
            "decode_tok_s_makespan": 200.0, "decode_tok_s_busy": None, "prefix_hit_rate": 0.9,
            "preemptions": 3, "mean_pause_wait_s": 0.0, "mean_wait_all_s": 0.1, "errors": errors}


def test_table_and_verdict() -> None:
    results = {"tao:tao": [_run(100, 1.0), _run(104, 1.1)], "floor": [_run(110, 2.0), _run(120, 2.2)],
               "vllm-router:cache_aware": [_run(103, 0.9), _run(108, 0.95)], "sglang-router:cache_aware": []}
    assert spread_pct(results["tao:tao"], "mean_task_latency_s") == pytest.approx(100 * 4 / 102)
    assert spread_pct(results["tao:tao"][:1], "mean_task_latency_s") is None
    rows = table_rows(results, {"sglang-router:cache_aware": "drops tao_synthetic"})
    assert all(len(r) == len(HEADERS) for r in rows)
    assert rows[0][:4] == ["tao:tao", "102.0", "153.0", "1.05"] and rows[0][5] == "—" and rows[0][6] == "90.0%"
    assert rows[0][-1] == "2" and rows[3][-1] == "0 (drops tao_synthetic)"
    md = markdown_table(rows)
    assert md.splitlines()[0].startswith("| system |") and len(md.splitlines()) == 2 + len(rows)
    v = verdict(results).splitlines()
    # latency: lowest, but cache_aware's best run (103) beats TAO's worst (104)
    assert v[0].startswith("mean_task_latency_s: tao:tao lowest but not beyond the spread")
    assert "vllm-router:cache_aware" in v[0]
    # TTFT: cache_aware is lower
    assert v[1].startswith("mean_ttft_s: tao:tao not lowest") and "vllm-router:cache_aware 0.925" in v[1]
    clean = {"tao:tao": [_run(100, 1.0), _run(101, 1.0)], "floor": [_run(110, 2.0), _run(111, 2.0)]}
    assert verdict(clean).splitlines()[0] == "mean_task_latency_s: tao:tao lowest, beyond the spread against all 1 others"


def test_thunderagent_real_is_its_own_system_started_with_its_documented_defaults(tmp_path) -> None:
    from bench.peers.core import ALL_SYSTEMS, THUNDERAGENT_REAL, thunderagent_argv

    ta = parse_system("thunderagent-real")
    assert ta == System(THUNDERAGENT_REAL) and ta.name == "thunderagent-real" and ta.package is None
    assert ta.name not in DEFAULT_SYSTEMS and ta.name in ALL_SYSTEMS
    assert parse_system("tao:thunderagent", ["thunderagent"]).name == "tao:thunderagent"
    # the bare name is ambiguous between the real proxy and TAO's re-implementation
    for bad in ("thunderagent", "ThunderAgent", "thunderagent:tr", "thunderagent-real:tr"):
        with pytest.raises(ValueError, match="tao:thunderagent"):
            parse_system(bad, ["thunderagent"])
    reps = ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    v = router_argv(ta, "/venv/bin", 9000, reps, 9001, profile_dir="/logs/p")
    assert v == thunderagent_argv("/venv/bin", 9000, reps, "/logs/p")
    assert v[0] == "/venv/bin/thunderagent" and v[v.index("--backends") + 1] == ",".join(reps)
    assert v[v.index("--backend-type") + 1] == "vllm" and v[v.index("--port") + 1] == "9000"
    assert "--metrics" in v and "--profile" in v and v[v.index("--profile-dir") + 1] == "/logs/p"
    # its scheduling parameters stay at ThunderAgent's own defaults: none is passed
    for tuned in ("--router", "--scheduler-interval", "--metrics-interval", "--acting-token-weight",
                  "--use-acting-token-decay"):
        assert tuned not in v
    assert "--profile-dir" not in thunderagent_argv("/b", 1, reps)
    # the variant: both 5 s wall-clock intervals shortened to 5 s of the replicas' model time
    mt = parse_system("thunderagent-real:model-time")
    assert mt.name == "thunderagent-real:model-time" and mt.name not in ALL_SYSTEMS
    m = router_argv(mt, "/b", 1, reps, 2, time_scale=20.0)
    assert m[m.index("--scheduler-interval") + 1] == m[m.index("--metrics-interval") + 1] == "0.25"
    assert "--scheduler-interval" not in router_argv(ta, "/b", 1, reps, 2, time_scale=20.0)
    # command line: skipped without a checkout; a checkout must be a Python project
    args = parse(["--systems", "floor,thunderagent-real,tao:thunderagent"])
    assert [s.name for s in args.system_list] == ["floor", "thunderagent-real", "tao:thunderagent"]
    assert args.thunderagent_src is None
    with pytest.raises(SystemExit):
        parse(["--systems", "thunderagent-real", "--thunderagent-src", str(tmp_path)])
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'ThunderAgent'\n")
    assert parse(["--systems", "thunderagent-real", "--thunderagent-src", str(tmp_path)]).thunderagent_src == tmp_path
    # the peers' versions are pinned to those docs/benchmarks.md measured
    assert (args.vllm_router_spec, args.sglang_router_spec) == ("vllm-router==0.1.17", "sglang-router==0.3.2")


def test_source_identity_names_the_commit_or_hashes_the_files(tmp_path) -> None:
    import subprocess

    from bench.peers.__main__ import source_identity

    (tmp_path / "a.py").write_text("x = 1\n")
    first = source_identity(tmp_path)
    assert str(tmp_path) in first and "not a git checkout" in first
    # what pip install leaves behind does not change it
    for junk in ("build/lib/a.py", "X.egg-info/PKG-INFO", "__pycache__/a.pyc"):
        (tmp_path / junk).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / junk).write_text("junk")
    assert source_identity(tmp_path) == first
    (tmp_path / "a.py").write_text("x = 2\n")
    assert source_identity(tmp_path) != first
    git = ["git", "-C", str(tmp_path), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "a.py"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "m"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    assert source_identity(tmp_path).startswith(f"commit {head} ")
    (tmp_path / "a.py").write_text("x = 3\n")
    assert source_identity(tmp_path).startswith(f"commit {head}+dirty ")


def test_dynamo_kv_runs_dynamos_router_on_the_replicas_kv_events_and_geometry() -> None:
    reps = ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    dyn = parse_system("dynamo:kv")
    assert dyn == System("dynamo", "kv") and dyn.needs_kv_events and dyn.package == "ai-dynamo-runtime"
    assert "dynamo:kv" in DEFAULT_SYSTEMS
    for bad in ("dynamo:round_robin", "dynamo"):
        with pytest.raises(ValueError):
            parse_system(bad)
    sources = {reps[0]: {"endpoint": "tcp://127.0.0.1:5001", "replay_endpoint": "tcp://127.0.0.1:5002"},
               reps[1]: {"endpoint": "tcp://127.0.0.1:5003"}}
    args = dynamo_kv_args(sources, "Qwen/Qwen3-32B", 16, 6000, 95984, "/tmp/d")
    assert args == ["--store", "/tmp/d", "--model", "Qwen/Qwen3-32B", "--block-size", "16", "--kv-blocks", "6000",
                    "--context-length", "95984", "--replica", "http://127.0.0.1:1=tcp://127.0.0.1:5001",
                    "--replica", "http://127.0.0.1:2=tcp://127.0.0.1:5003"]
    v = router_argv(dyn, "/venv/bin", 9000, reps, 9001, kv_args=args)
    assert v[:6] == ["/venv/bin/python", DYNAMO_SCRIPT, "serve", "--port", "9000", "--store"]
    assert v[-len(args):] == args and DYNAMO_SCRIPT.endswith("bench/peers/dynamo_kv.py")
    with pytest.raises(ValueError, match="KV-event sources"):
        router_argv(dyn, "/b", 1, reps, 2)
    # the front's own command line, as serve and worker parse it
    from bench.peers.dynamo_kv import parse as parse_front
    served = parse_front(["serve", "--port", "9000", *args])
    assert (served.port, served.kv_blocks, served.context_length) == (9000, 6000, 95984)
    assert served.replica == ["http://127.0.0.1:1=tcp://127.0.0.1:5001", "http://127.0.0.1:2=tcp://127.0.0.1:5003"]
    with pytest.raises(SystemExit):
        parse_front(["serve", "--port", "9000"])
