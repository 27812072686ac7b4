"""vLLM's Prometheus metrics for one emulated replica (own ``CollectorRegistry`` per server).

Names, types, labels and histogram buckets follow ``vllm/v1/metrics/loggers.py``: labels
``model_name`` and ``engine`` ("0"); counters are exposed with the ``_total`` suffix that
prometheus_client adds. Engine-state gauges and engine counters are read at scrape time by a
custom collector, so a scrape always sees the engine's current state.

``vllm:cache_config_info`` carries ``block_size`` and ``num_gpu_blocks``: KV capacity in tokens is
their product. Extra, non-vLLM series (``tao_vllm_sim_*``): model time since start, how far
model time trails scaled wall time now and at worst (the emulator falling behind its model), and
the counter ``tao_vllm_sim_busy_seconds_total`` of model seconds spent executing engine steps
(output tokens / busy seconds = decode tokens per busy engine-second).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from services.sim.engine import Engine

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                           120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
#: vLLM's ``FINISH_REASON_STRINGS`` (``vllm/v1/engine/__init__.py``); ``vllm/v1/metrics/loggers.py``
#: exports a ``vllm:request_success_total{finished_reason=…}`` series for each, so those the
#: emulator never ends with ("error", "repetition") are there at 0, as in vLLM (ThunderAgent's
#: ``backend/vllm_metrics.py`` reads stop, length, abort and error)
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")
LABELS = ("model_name", "engine")


class _EngineCollector(Collector):
    def __init__(self, engine: Engine, model_name: str, clock: Callable[[], tuple[float, float, float]],
                 gpu_memory_utilization: float) -> None:
        self._e = engine
        self._labels = [model_name, "0"]
        self._clock = clock
        self._util = gpu_memory_utilization

    def _gauge(self, name: str, doc: str, value: float) -> GaugeMetricFamily:
        g = GaugeMetricFamily(name, doc, labels=list(LABELS))
        g.add_metric(self._labels, value)
        return g

    def _counter(self, name: str, doc: str, value: float) -> CounterMetricFamily:
        c = CounterMetricFamily(name, doc, labels=list(LABELS))
        c.add_metric(self._labels, value)
        return c

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        e = self._e
        info = GaugeMetricFamily("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
                                 labels=["block_size", "cache_dtype", "enable_prefix_caching",
                                         "gpu_memory_utilization", "num_cpu_blocks", "num_gpu_blocks",
                                         "num_gpu_blocks_override", "engine"])
        info.add_metric([str(e.block_size), "auto", str(e.enable_prefix_caching), str(self._util), "None",
                         str(e.num_gpu_blocks), "None", "0"], 1.0)
        yield info
        yield self._gauge("vllm:num_requests_running", "Number of requests in model execution batches.",
                          e.num_running)
        yield self._gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
                          e.num_waiting)
        yield self._gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
                          e.kv_cache_usage)
        yield self._counter("vllm:prefix_cache_queries",
                            "Prefix cache queries, in terms of number of queried tokens.", e.prefix_cache_queries)
        yield self._counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.",
                            e.prefix_cache_hits)
        yield self._counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.",
                            e.num_preemptions_total)
        yield self._counter("vllm:generation_tokens", "Number of generation tokens processed.",
                            e.generation_tokens_total)
        # Not a vLLM metric: model seconds the engine spent executing steps (the denominator of
        # vLLM's generation throughput per busy engine-second; idle time is not counted).
        yield self._counter("tao_vllm_sim_busy_seconds",
                            "Model seconds the engine spent executing steps (busy time).", e.busy_time_s)
        model_s, lag_s, max_lag_s = self._clock()
        yield self._gauge("tao_vllm_sim_model_time_seconds", "Model (simulated) time since start.", model_s)
        yield self._gauge("tao_vllm_sim_lag_seconds",
                          "How far model time trails scaled wall time (model seconds).", lag_s)
        yield self._gauge("tao_vllm_sim_max_lag_seconds", "Largest lag seen so far (model seconds).", max_lag_s)


class SimMetrics:
    """Registry + per-request instruments; times observed are model (simulated) seconds."""

    def __init__(self, engine: Engine, model_name: str, clock: Callable[[], tuple[float, float, float]],
                 gpu_memory_utilization: float = 0.9) -> None:
        # vLLM exposes no ``_created`` series (it disables them process-wide, as we do here).
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_EngineCollector(engine, model_name, clock, gpu_memory_utilization))
        labels = [model_name, "0"]
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Number of prefill tokens processed.", LABELS,
                                     registry=self.registry).labels(*labels)
        success = Counter("vllm:request_success", "Count of successfully processed requests.",
                          [*LABELS, "finished_reason"], registry=self.registry)
        self.success = {r: success.labels(model_name, "0", r) for r in FINISH_REASONS}
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                              LABELS, buckets=TTFT_BUCKETS, registry=self.registry).labels(*labels)
        self.itl = Histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                             LABELS, buckets=ITL_BUCKETS, registry=self.registry).labels(*labels)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                             LABELS, buckets=REQUEST_LATENCY_BUCKETS, registry=self.registry).labels(*labels)

    def render(self) -> bytes:
        return generate_latest(self.registry)
