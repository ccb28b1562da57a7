"""The step loop: where a step happens. One ReplicaDriver per replica, one asyncio task each:

    refill its core from `pending`  ->  plan = core.schedule()  ->  send the plan to every rank
    ->  await the worker's StepResult  ->  core.update(plan, result)  ->  outputs to the clients.

With async scheduling the next plan is made and sent before the answer to the one in flight is
awaited, so the worker finds it waiting when its step ends. A step costs O(batch), never
O(waiting): the refill moves at most a watermark of requests into the core, and the core's
schedule() and update() touch only what they plan (the core's complexity contract, scheduler.py).
The service (service.py) owns the sockets, the clients' messages and the membership of replicas,
and hands a driver only what a step needs: a way to send a plan to the replica's ranks, the live
requests, the flush of their outputs, and the drop of a replica whose loop failed. What
schedule() decides is the core's.
"""
import logging
import time
from collections.abc import Awaitable, Callable

from protocol import ErrorCode
from protocol.worker_messages import StepPlan
from scheduler_svc.config import SchedulerConfig
from scheduler_svc.errors import RequestRejected
from scheduler_svc.live_requests import LiveRequests
from scheduler_svc.metrics import SchedulerMetrics
from scheduler_svc.outputs import output_for
from scheduler_svc.replica import Replica, WorkerLost
from scheduler_svc.replica_set import ReplicaSet

logger = logging.getLogger("stepserve.scheduler")


class ReplicaDriver:
    """Drives one replica's steps until the replica is dropped."""

    def __init__(self, replica: Replica, replicas: ReplicaSet, config: SchedulerConfig, requests: LiveRequests, *,
                 send_plan: Callable[[Replica, StepPlan], Awaitable[None]],
                 flush_outputs: Callable[[], Awaitable[None]], drop_replica: Callable[[Replica], None],
                 metrics: SchedulerMetrics | None, check_integrity_when_idle: bool):
        """send_plan: sends a plan to every rank of the replica; flush_outputs: sends the outputs
        queued in requests.outputs to their clients; drop_replica: called if this loop fails, so
        that the replica's requests are recomputed elsewhere."""
        self.replica = replica
        self.replicas = replicas  # the others, which routing may send a request to
        self.core = replica.core
        self.requests = requests
        self._send_plan = send_plan
        self._flush_outputs = flush_outputs
        self._drop_replica = drop_replica
        self.metrics = metrics
        self.check_integrity_when_idle = check_integrity_when_idle
        self.plans_in_flight = config.plans_in_flight
        # Requests the core holds waiting at most: a late or a lightly loaded replica takes work
        # at once, and a dead replica's requests go back to the front of `pending`.
        self.watermark = 2 * config.max_num_seqs
        self.priority_policy = config.policy == "priority"

    async def run(self) -> None:
        try:
            await self._step_loop()
        except Exception:  # a bug in one replica's loop: recompute its requests elsewhere
            logger.exception("replica %s step loop failed", self.replica.name)
            self._drop_replica(self.replica)

    async def _step_loop(self) -> None:
        replica, core = self.replica, self.core
        while replica.alive:
            if core.num_plans_in_flight < self.plans_in_flight:
                self.refill()
                plan = core.schedule()
                if plan is not None:
                    replica.begin_step(plan)
                    await self._send_plan(replica, plan)
                    continue
            if not core.num_plans_in_flight:
                await self._flush_outputs()
                if self.check_integrity_when_idle:
                    core.check_integrity()
                replica.wakeup.clear()
                await replica.wakeup.wait()
                continue
            try:
                plan, result = await replica.oldest_result()
            except WorkerLost:
                return
            if result.error is not None:
                logger.error("worker %s failed step %d: %s", replica.name, plan.step_id, result.error)
            self._apply(core.update(plan, result), result.error)
            await self._flush_outputs()

    def refill(self) -> None:
        """Moves pending requests into the core, up to the watermark of waiting ones; one the
        core refuses (scheduler_svc/validation.py) fails alone.

        Under the priority policy the requests more urgent than the core's waiting head pass the
        watermark, up to a second watermark's worth: else an interactive request would sit behind
        a core queue full of batch work until enough of it was admitted, many steps. A refill
        moves at most two watermarks of requests, so a step stays O(batch)."""
        replica, core, pending, router = self.replica, self.core, self.requests.pending, self.requests.router
        head = core.waiting_head
        # The head as the refill began: a burst of urgent requests enters together.
        urgent_below = head.priority if self.priority_policy and head is not None else None
        while True:
            request, queue = router.next_for(replica, pending)
            if request is None:
                break
            if core.num_waiting >= self.watermark and not (
                    urgent_below is not None and request.priority < urgent_below
                    and core.num_waiting < 2 * self.watermark):
                break
            if queue is pending:
                # Routed away at most until that replica is past the balance threshold above this
                # one's load, which is under the watermark: a refill stays O(watermark).
                destination = router.destination(request, replica, self.replicas)
                if destination is not replica:
                    pending.pop()
                    router.send(request, destination)
                    continue
            try:
                core.add_request(request)
            except RequestRejected as e:
                self.requests.end(request, "error", (e.code, e.message))  # still the front of its queue
                continue
            router.taken(request, queue)  # the request peeked: now its core holds it

    def _apply(self, updates, step_error: str | None) -> None:
        """A step's updates to the clients: a delta each, or the end of a finished request."""
        requests, metrics, now = self.requests, self.metrics, time.monotonic()
        error = (ErrorCode.WORKER_ERROR, step_error or "the worker returned no token for this request")
        for update in updates:
            request = update.request
            if metrics is not None:
                metrics.on_tokens(request.request_id, len(update.new_token_ids), now)
            if update.finish_reason is not None:
                requests.end(request, update.finish_reason, update.error or error, update.new_token_ids,
                             update.new_logprobs)
                continue
            output = output_for(request, update.new_token_ids, update.new_logprobs, None)
            if output is not None:
                requests.outputs.add(request.client, output)
