"""The step loop: where a step happens. One ReplicaDriver per replica, one asyncio task each:

    refill its core from `pending`  ->  plan = core.schedule()  ->  send the plan to every rank
    ->  await the worker's StepResult  ->  core.update(plan, result)  ->  outputs to the clients.

With async scheduling the next plan is made and sent before the answer to the one in flight is
awaited, so the worker finds it waiting when its step ends. A step costs O(batch), never
O(waiting): the refill moves at most a watermark of requests into the core, and the core's
schedule() and update() touch only what they plan (the core's complexity contract, scheduler.py).
The service (service.py) owns the sockets, the clients' messages and the membership of replicas;
what schedule() decides is the core's.
"""
import logging
import time
from typing import TYPE_CHECKING

from protocol import ErrorCode
from protocol.codec import encode
from scheduler_svc.errors import RequestRejected
from scheduler_svc.outputs import output_for
from scheduler_svc.replica import Replica, WorkerLost

if TYPE_CHECKING:
    from scheduler_svc.service import SchedulerService

logger = logging.getLogger("stepserve.scheduler")


class ReplicaDriver:
    """Drives one replica's steps until the replica is dropped."""

    def __init__(self, replica: Replica, service: "SchedulerService"):
        self.replica = replica
        self.service = service
        self.core = replica.core
        self.plans_in_flight = service.config.plans_in_flight
        # Requests the core holds waiting at most: a late or a lightly loaded replica takes work
        # at once, and a dead replica's requests go back to the front of `pending`.
        self.watermark = 2 * service.config.max_num_seqs
        self.priority_policy = service.config.policy == "priority"

    async def run(self) -> None:
        try:
            await self._step_loop()
        except Exception:  # a bug in one replica's loop: recompute its requests elsewhere
            logger.exception("replica %s step loop failed", self.replica.name)
            self.service.drop_replica(self.replica)

    async def _step_loop(self) -> None:
        replica, core, service = self.replica, self.core, self.service
        while replica.alive:
            if core.num_plans_in_flight < self.plans_in_flight:
                self._refill()
                plan = core.schedule()
                if plan is not None:
                    replica.begin_step(plan)
                    payload = encode(plan)
                    for identity in replica.identities.values():
                        await service.workers.send_multipart([identity, payload])
                    continue
            if not core.num_plans_in_flight:
                await service.flush_outputs()
                if service.check_integrity_when_idle:
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
            await service.flush_outputs()

    def _refill(self) -> None:
        """Moves pending requests into the core, up to the watermark of waiting ones; one the
        core refuses (scheduler_svc/validation.py) fails alone.

        Under the priority policy the requests more urgent than the core's waiting head pass the
        watermark, up to a second watermark's worth: else an interactive request would sit behind
        a core queue full of batch work until enough of it was admitted, many steps. A refill
        moves at most two watermarks of requests, so a step stays O(batch)."""
        core, pending = self.core, self.service.requests.pending
        head = core.waiting_head
        # The head as the refill began: a burst of urgent requests enters together.
        urgent_below = head.priority if self.priority_policy and head is not None else None
        while True:
            request = pending.peek()
            if request is None:
                break
            if core.num_waiting >= self.watermark and not (
                    urgent_below is not None and request.priority < urgent_below
                    and core.num_waiting < 2 * self.watermark):
                break
            try:
                core.add_request(request)
            except RequestRejected as e:
                self.service.requests.end(request, "error", (e.code, e.message))  # still the head of `pending`
                continue
            pending.pop()  # the request peeked: now its core holds it

    def _apply(self, updates, step_error: str | None) -> None:
        """A step's updates to the clients: a delta each, or the end of a finished request."""
        service, metrics, now = self.service, self.service.metrics, time.monotonic()
        error = (ErrorCode.WORKER_ERROR, step_error or "the worker returned no token for this request")
        for update in updates:
            request = update.request
            if metrics is not None:
                metrics.on_tokens(request.request_id, len(update.new_token_ids), now)
            if update.finish_reason is not None:
                service.requests.end(request, update.finish_reason, update.error or error, update.new_token_ids,
                                     update.new_logprobs)
                continue
            output = output_for(request, update.new_token_ids, update.new_logprobs, None)
            if output is not None:
                service.requests.outputs.add(request.client, output)
