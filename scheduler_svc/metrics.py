"""The scheduler's own Prometheus endpoint (--metrics-port), for deployments with no gateway.

The same metrics as the gateway's /metrics (protocol.metrics), measured here: time to first
token from the request's arrival at the scheduler, inter-token latency between the steps that
produced its tokens. Served by prometheus_client's HTTP server on a thread of its own, so a
scrape never waits for the step loop; the queue gauges are read from the service at scrape time.
"""
import logging
from collections.abc import Callable

from prometheus_client import start_http_server

from protocol.client_messages import Health
from protocol.metrics import QueueState, RequestTimer, ServingMetrics
from scheduler_svc.request import Request

logger = logging.getLogger("stepserve.scheduler")


class SchedulerMetrics:
    def __init__(self, health: Callable[[], Health]):
        self._health = health
        self.metrics = ServingMetrics(self._queue_state)
        self._timers: dict[str, RequestTimer] = {}  # live requests only

    def _queue_state(self) -> QueueState:
        try:
            h = self._health()
        except Exception:  # read from another thread while the loop changes the replicas: skip a scrape
            logger.debug("metrics snapshot failed", exc_info=True)
            return QueueState()
        return QueueState.of(h)

    def serve(self, host: str, port: int) -> int:
        """Starts the HTTP server; returns the bound port (port 0 picks a free one)."""
        server, _ = start_http_server(port, addr=host, registry=self.metrics.registry)
        return server.server_port

    def on_arrival(self, request_id: str) -> None:
        self._timers[request_id] = RequestTimer(self.metrics)

    def on_tokens(self, request_id: str, num_tokens: int, now: float) -> None:
        timer = self._timers.get(request_id)
        if timer is not None:
            timer.on_tokens(num_tokens, now)

    def on_end(self, request: Request, finish_reason: str) -> None:
        timer = self._timers.pop(request.request_id, None)
        if timer is not None:
            timer.on_finish(finish_reason, request.num_prompt_tokens)
