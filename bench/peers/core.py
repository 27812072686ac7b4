"""Pure parts of `python -m bench.peers`: the systems, their command lines, the table.

A *system* is one router (with one policy) in front of the same fresh emulated replicas:

- ``floor``: the bare replicas behind a plain HTTP round-robin proxy (``bench.peers.rrproxy``);
- ``vllm-router:<policy>``: the vLLM project's Rust router, one of its ``--policy`` values, or
  ``vllm-router:program`` (its program-level scheduling, ``--enable-program-scheduling``);
- ``sglang-router:<policy>``: SGLang's Rust router (``sglang-router launch``);
- ``tao:<policy>``: TAO's whole stack (Redis, router, planner, predictor, budget) with that
  registry policy, tool events to the predictor;
- ``thunderagent-real``: the ThunderAgent project's own proxy (its ``thunderagent`` command),
  installed from a checkout given with ``--thunderagent-src``. Not ``tao:thunderagent``, which
  is TAO's re-implementation of its policy inside TAO's stack;
- ``dynamo:kv``: NVIDIA Dynamo's KV router (``KvRouter`` of ``ai-dynamo-runtime``, its defaults)
  on the replicas' KV events, behind the thin HTTP front of ``bench/peers/dynamo_kv.py``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from services.sim.cluster.oracle import SIM_ONLY

#: ``vllm-router --help`` (0.1.17): --policy {random, round_robin, cache_aware, kv_aware,
#: power_of_two, consistent_hash, sticky_least_loaded}; "program" = --enable-program-scheduling
VLLM_ROUTER_POLICIES = ("round_robin", "random", "cache_aware", "kv_aware", "power_of_two", "consistent_hash",
                        "sticky_least_loaded", "program")
#: ``sglang-router launch --help`` (0.3.2): --policy {random, round_robin, cache_aware, power_of_two, manual}
SGLANG_ROUTER_POLICIES = ("round_robin", "random", "cache_aware", "power_of_two", "manual")
#: the real ThunderAgent (``--thunderagent-src``); a single word, like ``floor``, so that it
#: cannot be read as a ``tao:`` policy
THUNDERAGENT_REAL = "thunderagent-real"
#: NVIDIA Dynamo's routers: ``kv`` (its frontend's ``--router-mode kv``: the KV router)
DYNAMO_POLICIES = ("kv",)
KINDS = ("floor", "vllm-router", "sglang-router", "dynamo", "tao", THUNDERAGENT_REAL)
#: the PyPI package of each kind that comes from PyPI
PACKAGES = {"vllm-router": "vllm-router", "sglang-router": "sglang-router", "dynamo": "ai-dynamo-runtime"}
#: what else a package's system needs in the peers' venv (``dynamo_kv.py``'s HTTP front: aiohttp)
EXTRA_REQUIREMENTS = {"ai-dynamo-runtime": ("aiohttp",)}
#: a package installed without a console script of its name is checked by importing these
IMPORTS = {"ai-dynamo-runtime": ("dynamo._core", "aiohttp")}
#: ``dynamo:kv``'s front (run by the peers' venv python; imports nothing of this repository)
DYNAMO_SCRIPT = str(Path(__file__).with_name("dynamo_kv.py"))
#: systems named by one word (no ``:POLICY``)
SINGLE_WORD = ("floor", THUNDERAGENT_REAL)
#: ``thunderagent-real:model-time``: the same, its two wall-clock intervals divided by the
#: time scale so that they last its default 5 s of *model* time (a variant, never by default)
TA_MODEL_TIME = "model-time"
#: ThunderAgent's ``--scheduler-interval`` and ``--metrics-interval`` defaults, wall seconds
#: (``ThunderAgent/__main__.py``, ``ThunderAgent/config.py``)
TA_DEFAULT_INTERVAL_S = 5.0

#: run by default (`--systems all` adds the rest). Left out by default: vllm-router
#: ``power_of_two``, ``sticky_least_loaded`` and ``random`` (load balancers without cache or
#: session knowledge, like round-robin here); sglang-router's other policies.
#: ``vllm-router:kv_aware`` routes on the replicas' KV events: its replicas publish them
#: (``--kv-events-config``) and it subscribes (``kv_event_router_args``).
#: ``thunderagent-real`` needs a source checkout (``--thunderagent-src``): only in ``all``
#: (skipped there without one) or by name.
DEFAULT_SYSTEMS = (
    "floor",
    "vllm-router:round_robin", "vllm-router:cache_aware", "vllm-router:kv_aware", "vllm-router:consistent_hash",
    "vllm-router:program",
    "sglang-router:cache_aware",
    "dynamo:kv",
    "tao:tao", "tao:thunderagent", "tao:round_robin",
)
ALL_SYSTEMS = (
    "floor",
    *(f"vllm-router:{p}" for p in VLLM_ROUTER_POLICIES),
    *(f"sglang-router:{p}" for p in SGLANG_ROUTER_POLICIES if p != "manual"),
    *(f"dynamo:{p}" for p in DYNAMO_POLICIES),
    "tao:tao", "tao:thunderagent", "tao:round_robin",
    THUNDERAGENT_REAL,
)


@dataclass(frozen=True, slots=True)
class System:
    kind: str  # one of KINDS
    policy: str = ""

    @property
    def name(self) -> str:
        return self.kind if self.kind in SINGLE_WORD and not self.policy else f"{self.kind}:{self.policy}"

    @property
    def needs_kv_events(self) -> bool:
        """Its replicas must publish vLLM's KV events (``--kv-events-config``) for its router."""
        return (self.kind, self.policy) in (("vllm-router", "kv_aware"), ("dynamo", "kv"))

    @property
    def package(self) -> str | None:
        """The PyPI package this system needs in the peers' venv (None: this repository)."""
        return PACKAGES.get(self.kind)


def parse_system(text: str, tao_policies: Sequence[str] | None = None) -> System:
    """``floor`` | ``thunderagent-real`` | ``vllm-router:P`` | ``sglang-router:P`` | ``tao:P``;
    ValueError when unknown."""
    text = text.strip()
    if text in SINGLE_WORD:
        return System(text)
    if text == f"{THUNDERAGENT_REAL}:{TA_MODEL_TIME}":
        return System(THUNDERAGENT_REAL, TA_MODEL_TIME)
    if text.lower() == "thunderagent" or text.lower().startswith(("thunderagent:", f"{THUNDERAGENT_REAL}:")):
        raise ValueError(f"{text!r}: say {THUNDERAGENT_REAL} (the ThunderAgent project's own proxy, "
                         "--thunderagent-src) or tao:thunderagent (TAO's re-implementation of its policy)")
    kind, sep, policy = text.partition(":")
    if not sep or not policy:
        raise ValueError(f"{text!r}: expected {' or '.join(SINGLE_WORD)} or KIND:POLICY with KIND in "
                         f"{', '.join(k for k in KINDS if k not in SINGLE_WORD)}")
    known: Sequence[str] | None
    if kind == "vllm-router":
        known = VLLM_ROUTER_POLICIES
    elif kind == "sglang-router":
        known = SGLANG_ROUTER_POLICIES
    elif kind == "dynamo":
        known = DYNAMO_POLICIES
    elif kind == "tao":
        known = tao_policies
    else:
        raise ValueError(f"{text!r}: unknown router {kind!r} (known: {', '.join(KINDS)})")
    if known is not None and policy not in known:
        raise ValueError(f"{text!r}: {kind} has no policy {policy!r} (known: {', '.join(known)})")
    if kind == "tao" and policy in SIM_ONLY:
        raise ValueError(f"tao:{policy} is simulator-only (it reads the future)")
    return System(kind, policy)


def parse_systems(text: str, tao_policies: Sequence[str] | None = None) -> list[System]:
    """A comma-separated list; ``default`` and ``all`` expand. Duplicates are an error."""
    names: list[str] = []
    for item in (t.strip() for t in text.split(",")):
        if not item:
            continue
        if item == "default":
            names += DEFAULT_SYSTEMS
        elif item == "all":
            names += ALL_SYSTEMS
        else:
            names.append(item)
    systems = [parse_system(n, tao_policies) for n in names]
    seen = [s.name for s in systems]
    dup = sorted({n for n in seen if seen.count(n) > 1})
    if dup:
        raise ValueError(f"listed more than once: {', '.join(dup)}")
    if not systems:
        raise ValueError("no systems given")
    return systems


#: vLLM's ``--kv-events-config`` for the replicas of a ``needs_kv_events`` system: ZMQ PUB and
#: replay sockets on ports the OS picks (vLLM binds when the endpoint has a ``*``); the router
#: learns them from each replica's ``GET /kv_event_sources``.
KV_EVENTS_CONFIG = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": "tcp://127.0.0.1:*",
                    "replay_endpoint": "tcp://127.0.0.1:*"}


def kv_event_router_args(sources: Mapping[str, Mapping[str, Any]], model: str, block_size: int) -> list[str]:
    """vllm-router's static KV-event configuration (``vllm-router --help``, 0.1.17:
    ``--kv-event-source WORKER_URL=ENDPOINT``, ``--kv-event-replay-source WORKER_URL=ENDPOINT``
    repeated per worker, ``--kv-event-model`` "shared model identity for workers with static
    event sources", ``--kv-event-block-size``). ``sources``: per worker URL, the rank-0 entry of
    its ``GET /kv_event_sources`` (vLLM #55844). vllm-router 0.1.17's own discovery cannot be
    used: it reads the block size from ``GET /get_server_info`` (SGLang's endpoint; vLLM serves
    none) and parses ``/kv_event_sources`` as a map keyed by DP rank, not vLLM's
    ``{"sources": [...]}``, so it would subscribe to nothing."""
    argv: list[str] = []
    for url, src in sources.items():
        argv += ["--kv-event-source", f"{url}={src['endpoint']}"]
        if src.get("replay_endpoint"):
            argv += ["--kv-event-replay-source", f"{url}={src['replay_endpoint']}"]
    return argv + ["--kv-event-model", model, "--kv-event-block-size", str(block_size)]


def dynamo_kv_args(sources: Mapping[str, Mapping[str, Any]], model: str, block_size: int, kv_blocks: int,
                   context_length: int, store: str) -> list[str]:
    """``bench/peers/dynamo_kv.py serve``'s replica arguments: per worker URL its rank-0 KV-event
    publisher (``GET /kv_event_sources``), and the replicas' geometry, which each Dynamo worker
    registers (``ModelRuntimeConfig``: KV blocks, block size, context length). ``store``: the
    folder of Dynamo's file discovery for this run."""
    argv = ["--store", store, "--model", model, "--block-size", str(block_size), "--kv-blocks", str(kv_blocks),
            "--context-length", str(context_length)]
    for url, src in sources.items():
        argv += ["--replica", f"{url}={src['endpoint']}"]
    return argv


def thunderagent_argv(bin_dir: str, port: int, replicas: Sequence[str], profile_dir: str | None = None,
                      model_time_scale: float | None = None) -> list[str]:
    """The real ThunderAgent as its README's "How to use?" starts it (``thunderagent
    --backend-type vllm --backends URL --port 9000 --metrics --profile``), here on 127.0.0.1 with
    the replicas comma-separated (``--backends``: "Comma-separated list of vLLM backend URLs").
    Every scheduling parameter is left at the default of ``ThunderAgent/__main__.py`` and
    ``ThunderAgent/config.py``: ``--router tr`` (capacity scheduling), ``--scheduler-interval 5.0``
    and ``--metrics-interval 5.0`` (wall seconds), ``--acting-token-weight 1.0``, no
    ``--use-acting-token-decay``. ``profile_dir``: where ``--profile`` writes its
    ``step_profiles.csv`` (default ``/tmp/thunderagent_profiles``); ``--log-level warning`` only
    quietens uvicorn's access log. ``model_time_scale`` (the ``model-time`` variant only): both
    intervals become 5 s / time scale of wall time, i.e. its default 5 s of the replicas' model
    time (at the defaults they are 5 wall seconds = 5 × time scale model seconds)."""
    argv = [f"{bin_dir}/thunderagent", "--backend-type", "vllm", "--backends", ",".join(replicas),
            "--host", "127.0.0.1", "--port", str(port), "--metrics", "--profile", "--log-level", "warning"]
    if model_time_scale is not None:
        wall = f"{TA_DEFAULT_INTERVAL_S / model_time_scale:g}"
        argv += ["--scheduler-interval", wall, "--metrics-interval", wall]
    return argv + (["--profile-dir", profile_dir] if profile_dir else [])


def router_argv(system: System, bin_dir: str, port: int, replicas: Sequence[str], metrics_port: int,
                python: str = "python", kv_args: Sequence[str] = (), profile_dir: str | None = None,
                time_scale: float = 1.0) -> list[str]:
    """The command line that serves ``system`` on 127.0.0.1:``port`` in front of ``replicas``
    (not for ``tao``: that is a whole stack). ``metrics_port``: the router's own Prometheus
    port (both Rust routers default to a fixed one, 29000, so runs would collide). ``kv_args``:
    ``kv_event_router_args`` (vllm-router) or ``dynamo_kv_args`` (Dynamo) for a ``needs_kv_events``
    system (required there).
    ``profile_dir``: ``thunderagent-real``'s profile CSV folder; ``time_scale``: the replicas'
    (for ``thunderagent-real:model-time``)."""
    if system.needs_kv_events and not kv_args:
        raise ValueError(f"{system.name} needs the replicas' KV-event sources (kv_event_router_args, dynamo_kv_args)")
    if system.kind == THUNDERAGENT_REAL:
        return thunderagent_argv(bin_dir, port, replicas, profile_dir,
                                 time_scale if system.policy == TA_MODEL_TIME else None)
    if system.kind == "floor":
        return [python, "-m", "bench.peers.rrproxy", "--port", str(port), *(a for r in replicas for a in ("--replica", r))]
    if system.kind == "vllm-router":
        argv = [f"{bin_dir}/vllm-router", "--host", "127.0.0.1", "--port", str(port), "--worker-urls", *replicas,
                "--prometheus-port", str(metrics_port), "--log-level", "warning"]
        if system.policy == "program":
            return argv + ["--enable-program-scheduling"]
        return argv + ["--policy", system.policy, *(kv_args if system.needs_kv_events else ())]
    if system.kind == "dynamo":
        return [f"{bin_dir}/python", DYNAMO_SCRIPT, "serve", "--port", str(port), *kv_args]
    if system.kind == "sglang-router":
        return [f"{bin_dir}/sglang-router", "launch", "--host", "127.0.0.1", "--port", str(port),
                "--worker-urls", *replicas, "--policy", system.policy, "--prometheus-port", str(metrics_port),
                "--log-level", "warn"]
    raise ValueError(f"{system.name} is started as a stack, not one command")


# ---------------------------------------------------------------------------------- results

#: the columns of the table: (metric key, header, format)
COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("mean_task_latency_s", "mean latency (s)", "{:.1f}"),
    ("p90_task_latency_s", "p90 latency (s)", "{:.1f}"),
    ("mean_ttft_s", "mean TTFT (s)", "{:.2f}"),
    ("decode_tok_s_makespan", "decode tok/s (makespan)", "{:.1f}"),
    ("decode_tok_s_busy", "decode tok/s (busy)", "{:.1f}"),
    ("prefix_hit_rate", "prefix hit", "{:.1%}"),
    ("preemptions", "preemptions", "{:.0f}"),
    ("mean_pause_wait_s", "pause wait (s)", "{:.1f}"),
    ("mean_wait_all_s", "wait before forwarding (s)", "{:.2f}"),
    ("errors", "errors", "{:.0f}"),
)
#: metrics whose run-to-run spread is shown
SPREAD_METRICS = ("mean_task_latency_s", "mean_ttft_s")


def _values(runs: Sequence[Mapping[str, Any]], metric: str) -> list[float]:
    return [float(r[metric]) for r in runs if r.get(metric) is not None]


def mean_of(runs: Sequence[Mapping[str, Any]], metric: str) -> float | None:
    v = _values(runs, metric)
    return sum(v) / len(v) if v else None


def spread_pct(runs: Sequence[Mapping[str, Any]], metric: str) -> float | None:
    """(max − min) / |mean| over the repeats, in percent; None with fewer than two runs."""
    v = _values(runs, metric)
    if len(v) < 2:
        return None
    mean = sum(v) / len(v)
    return 0.0 if mean == 0 else 100.0 * (max(v) - min(v)) / abs(mean)


def _fmt(fmt: str, v: float | None) -> str:
    return "—" if v is None else fmt.format(v)


def table_rows(results: Mapping[str, Sequence[Mapping[str, Any]]],
               failures: Mapping[str, str] | None = None) -> list[list[str]]:
    """One row per system (in ``results`` order): means over its runs, then the spread of
    mean latency and TTFT and the number of runs; systems in ``failures`` get their reason."""
    rows = []
    for name, runs in results.items():
        if not runs:
            reason = (failures or {}).get(name, "no run")
            rows.append([name] + ["—"] * len(COLUMNS) + ["—", "—", f"0 ({reason})"])
            continue
        row = [name] + [_fmt(fmt, mean_of(runs, key)) for key, _, fmt in COLUMNS]
        row += [_fmt("{:.1f}%", spread_pct(runs, m)) for m in SPREAD_METRICS]
        row.append(str(len(runs)))
        rows.append(row)
    return rows


HEADERS = ["system", *(h for _, h, _ in COLUMNS), "latency spread", "TTFT spread", "runs"]


def markdown_table(rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class Standing:
    """How one system stands against the reference on one metric (lower is better)."""

    metric: str
    other: str
    ours: float
    theirs: float
    #: every run of the reference below every run of the other (the ranges do not overlap;
    #: needs at least two runs of each)
    beyond_spread: bool

    @property
    def better(self) -> bool:
        return self.ours < self.theirs


def standings(results: Mapping[str, Sequence[Mapping[str, Any]]], reference: str,
              metrics: Sequence[str] = SPREAD_METRICS) -> list[Standing]:
    """``reference`` against every other system that ran, on each lower-is-better metric."""
    ref = results.get(reference) or []
    out = []
    for metric in metrics:
        ours = _values(ref, metric)
        if not ours:
            continue
        for other, runs in results.items():
            theirs = _values(runs, metric)
            if other == reference or not theirs:
                continue
            out.append(Standing(metric, other, sum(ours) / len(ours), sum(theirs) / len(theirs),
                                len(ours) > 1 and len(theirs) > 1 and max(ours) < min(theirs)))
    return out


def verdict(results: Mapping[str, Sequence[Mapping[str, Any]]], reference: str = "tao:tao") -> str:
    """One line per metric: is ``reference`` lowest, and beyond the run-to-run spread?"""
    lines = []
    by_metric: dict[str, list[Standing]] = {}
    for s in standings(results, reference):
        by_metric.setdefault(s.metric, []).append(s)
    for metric in SPREAD_METRICS:
        st = by_metric.get(metric)
        if not st:
            lines.append(f"{metric}: {reference} did not run")
            continue
        worse = [s for s in st if not s.better]
        unresolved = [s for s in st if s.better and not s.beyond_spread]
        if not worse and not unresolved:
            lines.append(f"{metric}: {reference} lowest, beyond the spread against all {len(st)} others")
            continue
        parts = []
        if worse:
            parts.append("lower: " + ", ".join(f"{s.other} {s.theirs:.4g} vs {s.ours:.4g}" for s in worse))
        if unresolved:
            parts.append("within the spread (or one run): " + ", ".join(f"{s.other} {s.theirs:.4g} vs {s.ours:.4g}"
                                                          for s in unresolved))
        lines.append(f"{metric}: {reference} {'not lowest' if worse else 'lowest but not beyond the spread'}; "
                     + "; ".join(parts))
    return "\n".join(lines)
