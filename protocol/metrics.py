"""The Prometheus metrics every serving process exposes (the gateway on /metrics, the scheduler
with --metrics-port): vLLM's names with the `stepserve:` prefix, so dashboards built for vLLM
need only the prefix changed. One owner for the names, help texts and buckets.

Counts are per sequence the scheduler runs: a prompt asked for n choices counts n requests.
Queue gauges and the preemption count come from a snapshot callable, read at scrape time.
"""
import time
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from protocol.client_messages import Health, ReplicaHealth

PREFIX = "stepserve:"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# vLLM's buckets.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
               480.0, 960.0, 1920.0, 7680.0)


@dataclass(frozen=True)
class QueueState:
    num_running: int = 0
    num_waiting: int = 0
    kv_cache_usage: float = 0.0  # fraction of the KV blocks in use, in [0, 1]
    num_preemptions: int = 0
    num_replicas_healthy: int = 0  # joined and answering
    num_replicas_unhealthy: int = 0  # dropped for silence, still connected (Health.unhealthy_replicas)
    replicas: tuple[ReplicaHealth, ...] = ()

    @classmethod
    def of(cls, h: Health) -> "QueueState":
        usage = 1.0 - h.num_free_blocks / h.num_total_blocks if h.num_total_blocks else 0.0
        return cls(h.num_running, h.num_waiting + h.num_swapped, usage, h.num_preemptions, len(h.replicas),
                   len(h.unhealthy_replicas), tuple(h.replicas))


def _per_replica(family, replicas: tuple[ReplicaHealth, ...], field: str):
    for replica in replicas:
        family.add_metric([replica.name], getattr(replica, field))
    return family


class _QueueCollector(Collector):
    def __init__(self, snapshot: Callable[[], QueueState]):
        self._snapshot = snapshot

    def collect(self):
        state = self._snapshot()
        yield GaugeMetricFamily(PREFIX + "num_requests_running", "Requests running on the workers.",
                                value=state.num_running)
        yield GaugeMetricFamily(PREFIX + "num_requests_waiting", "Requests waiting to be scheduled.",
                                value=state.num_waiting)
        yield GaugeMetricFamily(PREFIX + "kv_cache_usage_perc", "KV-cache usage: 1 means 100 percent.",
                                value=state.kv_cache_usage)
        yield CounterMetricFamily(PREFIX + "num_preemptions", "Preemptions since the scheduler started.",
                                  value=state.num_preemptions)
        yield GaugeMetricFamily(PREFIX + "num_replicas_healthy", "Replicas joined and answering their steps.",
                                value=state.num_replicas_healthy)
        yield GaugeMetricFamily(PREFIX + "num_replicas_unhealthy",
                                "Replicas dropped because their workers fell silent past --worker-timeout, "
                                "until they rejoin.", value=state.num_replicas_unhealthy)
        # vLLM's prefix cache counters (tokens), one series per replica: each holds its own cache.
        yield _per_replica(CounterMetricFamily(PREFIX + "prefix_cache_queries",
                                               "Prompt tokens looked up in the prefix cache.", labels=["replica"]),
                           state.replicas, "num_prefix_cache_queries")
        yield _per_replica(CounterMetricFamily(PREFIX + "prefix_cache_hits",
                                               "Prompt tokens found in the prefix cache.", labels=["replica"]),
                           state.replicas, "num_prefix_cache_hits")
        yield _per_replica(CounterMetricFamily(PREFIX + "requests_routed_by_prefix",
                                               "Requests sent to a replica because its prefix cache held more "
                                               "of their prompt (--routing prefix).", labels=["replica"]),
                           state.replicas, "num_routed_by_prefix")


class ServingMetrics:
    """A registry of the serving metrics; observe() requests through their RequestTimer."""

    def __init__(self, snapshot: Callable[[], QueueState]):
        self.registry = CollectorRegistry()
        self.registry.register(_QueueCollector(snapshot))
        r = self.registry
        self.prompt_tokens = Counter(PREFIX + "prompt_tokens", "Prefill tokens processed.", registry=r)
        self.generation_tokens = Counter(PREFIX + "generation_tokens", "Generation tokens produced.", registry=r)
        self.request_success = Counter(PREFIX + "request_success", "Finished requests, by finish reason.",
                                       ["finished_reason"], registry=r)
        self.time_to_first_token = Histogram(PREFIX + "time_to_first_token_seconds", "Time to first token.",
                                             buckets=TTFT_BUCKETS, registry=r)
        self.inter_token_latency = Histogram(PREFIX + "inter_token_latency_seconds", "Time between output tokens.",
                                             buckets=ITL_BUCKETS, registry=r)
        self.e2e_request_latency = Histogram(PREFIX + "e2e_request_latency_seconds", "Request latency, end to end.",
                                             buckets=E2E_BUCKETS, registry=r)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class RequestTimer:
    """One sequence's timings, from its arrival: feed it each output as it comes."""

    __slots__ = ("_metrics", "_arrival", "_last", "num_generated")

    def __init__(self, metrics: ServingMetrics, arrival: float | None = None):
        self._metrics = metrics
        self._arrival = time.monotonic() if arrival is None else arrival
        self._last: float | None = None
        self.num_generated = 0

    def on_tokens(self, num_tokens: int, now: float | None = None) -> None:
        if not num_tokens:
            return
        now = time.monotonic() if now is None else now
        if self._last is None:
            self._metrics.time_to_first_token.observe(now - self._arrival)
        else:
            self._metrics.inter_token_latency.observe(now - self._last)
        self._last = now
        self.num_generated += num_tokens

    def on_finish(self, finish_reason: str, num_prompt_tokens: int, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        metrics = self._metrics
        metrics.e2e_request_latency.observe(now - self._arrival)
        metrics.request_success.labels(finish_reason).inc()
        metrics.prompt_tokens.inc(num_prompt_tokens)
        metrics.generation_tokens.inc(self.num_generated)


class _BatchJobsCollector(Collector):
    def __init__(self, jobs_by_status: Callable[[], dict[str, int]]):
        self._jobs_by_status = jobs_by_status

    def collect(self):
        family = GaugeMetricFamily(PREFIX + "batch_jobs", "Batch API jobs, by status.", labels=["status"])
        for status, num_jobs in sorted(self._jobs_by_status().items()):
            family.add_metric([status], num_jobs)
        yield family


class BatchMetrics:
    """The Batch API's metrics, on the gateway's registry: its batch requests by outcome
    ("completed": answered with status 200, "failed": an error line), and the jobs of its
    --batch-dir by status, read at scrape time."""

    def __init__(self, registry: CollectorRegistry, jobs_by_status: Callable[[], dict[str, int]]):
        self.batch_requests = Counter(PREFIX + "batch_requests", "Batch requests finished, by outcome.",
                                      ["status"], registry=registry)
        registry.register(_BatchJobsCollector(jobs_by_status))

    def on_line(self, counts, ok: bool) -> None:
        self.batch_requests.labels("completed" if ok else "failed").inc()
