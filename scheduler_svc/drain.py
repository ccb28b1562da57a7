"""Graceful drain: what the scheduler does between SIGTERM (or SIGINT) and its exit, code 0.

It stops taking requests (new ones get `shutting_down`), lets the queued and running ones finish
for up to drain_timeout_s, fails what is left with `shutting_down` (each client hears of each of
its requests), then stops: the workers are told to shut down, and they finish the step they are
in first. A second signal cuts the wait short. With no worker joined nothing can finish, so the
drain does not wait for one.
"""
import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from protocol import ErrorCode
from scheduler_svc.admission import Admission
from scheduler_svc.live_requests import LiveRequests
from scheduler_svc.replica_set import ReplicaSet

logger = logging.getLogger("stepserve.scheduler")
POLL_S = 0.05


@dataclass(eq=False)
class Drain:
    admission: Admission
    requests: LiveRequests
    replicas: ReplicaSet
    flush_outputs: Callable[[], Awaitable[None]]  # sends the outputs queued in requests.outputs to their clients
    stop: Callable[[], None]  # ends the service: it tells the workers to shut down
    timeout_s: float = 30.0
    _task: asyncio.Task | None = field(default=None, init=False)
    _cut_short: asyncio.Event = field(default_factory=asyncio.Event, init=False)

    def begin(self) -> None:
        """The signal handler: the first call starts the drain, a second one ends it now."""
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())
        else:
            logger.warning("second stop signal: failing what is left now")
            self._cut_short.set()

    async def _run(self) -> None:
        requests = self.requests
        self.admission.draining = True
        logger.info("draining: %d requests to finish in at most %.1f s", len(requests.book), self.timeout_s)
        deadline = time.monotonic() + self.timeout_s
        while len(requests.book) and self.replicas and not self._cut_short.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                await asyncio.wait_for(self._cut_short.wait(), min(POLL_S, left))
            except asyncio.TimeoutError:
                pass
        num_left = len(requests.book)
        if num_left:
            logger.warning("drain: %d requests not finished; failing them", num_left)
        requests.fail_all(ErrorCode.SHUTTING_DOWN, "the scheduler shut down before this request finished "
                                                   f"(--drain-timeout-s {self.timeout_s:g})")
        await self.flush_outputs()
        self.stop()
