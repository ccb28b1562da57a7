"""The scheduler process: ZeroMQ sockets and asyncio loops around the sans-IO core.

Clients (DEALER) -> ROUTER frontend; workers (DEALER) -> ROUTER workers. Requests wait in
`pending` until a replica has room; each replica's core then plans its steps. A replica pulls
at most a watermark of requests into its own waiting queue, so a late or a lightly loaded
replica takes work at once, and a dead replica's requests go back to the front of `pending`.

Operating it: CurveZMQ and the open-port warning (auth.py), backpressure (admission.py), the
drain on SIGTERM (drain.py), crashed workers noticed by their closed connection
(worker_connections.py), and an instance id in every heartbeat reply, so that workers of a
restarted scheduler say hello again.
"""
import asyncio
import itertools
import logging
import time
import uuid

import zmq
import zmq.asyncio

from protocol import ErrorCode, ProtocolError
from protocol.client_messages import (Abort, ErrorReply, Generate, Health, HealthQuery,
                                      ModelInfo, ModelInfoQuery, RequestOutputs)
from protocol.codec import client_to_scheduler_decoder, encode, salvage_generate, worker_to_scheduler_decoder
from protocol.worker_messages import Heartbeat, HeartbeatReply, Shutdown, StepResult, WorkerHello
from scheduler_svc.admission import DEFAULT_MAX_QUEUED_REQUESTS, Admission
from scheduler_svc.auth import FrontDoor
from scheduler_svc.config import SchedulerConfig
from scheduler_svc.drain import Drain
from scheduler_svc.errors import RequestRejected
from scheduler_svc.gc_tuning import tune_gc_for_large_queues
from scheduler_svc.metrics import SchedulerMetrics
from scheduler_svc.outputs import OutputBatcher, error_output, output_for
from scheduler_svc.replica import Replica, WorkerLost
from scheduler_svc.stats import health, model_info
from scheduler_svc.request import Request
from scheduler_svc.request_book import RequestBook
from scheduler_svc.waiting_queue import make_waiting_queue
from scheduler_svc.worker_connections import WorkerConnections

logger = logging.getLogger("stepserve.scheduler")


class SchedulerService:
    def __init__(self, frontend_address: str, workers_address: str, config: SchedulerConfig,
                 worker_timeout_s: float = 10.0, max_message_bytes: int = 256 << 20,
                 check_integrity_when_idle: bool = True, enable_metrics: bool = False,
                 max_queued_requests: int = DEFAULT_MAX_QUEUED_REQUESTS, drain_timeout_s: float = 30.0,
                 front_door: FrontDoor | None = None):
        self.config = config
        self.instance_id = uuid.uuid4().hex[:12]  # new on every start: workers and clients tell a restart
        self.admission = Admission(max_queued_requests)
        self.drain = Drain(self, drain_timeout_s)
        self.front_door = front_door or FrontDoor()
        # Prometheus metrics (--metrics-port); None when off, and then they cost nothing.
        self.metrics = SchedulerMetrics(self._health) if enable_metrics else None
        self.frontend_address = frontend_address
        self.workers_address = workers_address
        self.worker_timeout_s = worker_timeout_s
        self.max_message_bytes = max_message_bytes
        self.check_integrity_when_idle = check_integrity_when_idle
        self.pending = make_waiting_queue(config.policy)
        self.book = RequestBook()  # every live request, by id, client and replica
        self.replicas: dict[str, Replica] = {}  # by group name
        self.replica_by_worker_id: dict[str, Replica] = {}
        self.replica_by_identity: dict[bytes, Replica] = {}
        self.outputs = OutputBatcher()
        self.last_hello: WorkerHello | None = None
        self._client_decoder = client_to_scheduler_decoder()
        self._worker_decoder = worker_to_scheduler_decoder()
        # One arrival counter for `pending` and every replica's core: a request keeps a unique
        # number wherever it waits, so priority ties break by arrival, never by comparing Requests.
        self._arrivals = itertools.count()
        self._tasks: set[asyncio.Task] = set()
        self._stopping = asyncio.Event()

    # ---- sockets and loops ---------------------------------------------------------

    def bind(self) -> tuple[str, str]:
        self.ctx = zmq.asyncio.Context()
        self.front_door.open(self.ctx)  # before any bind: every handshake is checked
        self.frontend = self._router(self.frontend_address)
        self.workers = self._router(self.workers_address)
        self.worker_connections = WorkerConnections(self.workers)
        logger.info("scheduler instance %s", self.instance_id)
        return (self.frontend.getsockopt_string(zmq.LAST_ENDPOINT),
                self.workers.getsockopt_string(zmq.LAST_ENDPOINT))

    def _router(self, address: str) -> zmq.asyncio.Socket:
        sock = self.ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a vanished peer raises instead of dropping
        sock.setsockopt(zmq.MAXMSGSIZE, self.max_message_bytes)
        sock.setsockopt(zmq.SNDHWM, 0)
        sock.setsockopt(zmq.RCVHWM, 0)
        sock.setsockopt(zmq.LINGER, 0)
        self.front_door.prepare(sock, address)
        sock.bind(address)
        return sock

    async def serve(self) -> None:
        loops = [self._frontend_loop(), self._workers_loop(), self._watchdog_loop(), self._closed_workers_loop()]
        tasks = [asyncio.ensure_future(c) for c in loops]
        try:
            await self._stopping.wait()
        finally:
            for task in tasks + list(self._tasks):
                task.cancel()
            await asyncio.gather(*tasks, *self._tasks, return_exceptions=True)
            await self._shutdown_workers()
            self.worker_connections.close()
            self.front_door.close()
            # A moment for the last outputs and the workers' Shutdown to leave.
            self.ctx.destroy(linger=1000)

    def stop(self) -> None:
        self._stopping.set()

    async def _shutdown_workers(self) -> None:
        for replica in self.replicas.values():
            await self._send_shutdown(replica, "scheduler stopping")

    async def _send_shutdown(self, replica: Replica, reason: str) -> None:
        for identity in replica.identities.values():
            try:
                await self.workers.send_multipart([identity, encode(Shutdown(reason))], flags=zmq.NOBLOCK)
            except zmq.ZMQError:
                pass  # already gone

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error("task failed", exc_info=task.exception())

    async def _frontend_loop(self) -> None:
        while True:
            frames = await self.frontend.recv_multipart(copy=False)
            client = frames[0].bytes
            if len(frames) != 2:
                await self._reply(client, ErrorReply(ErrorCode.BAD_FRAME, f"expected 1 frame, got {len(frames) - 1}"))
                continue
            try:
                message = self._client_decoder.decode(frames[1].buffer)
            except ProtocolError as e:
                if not self._salvage(client, frames[1].buffer):
                    await self._reply(client, ErrorReply(ErrorCode.BAD_FRAME, str(e)))
                await self.flush_outputs()
                continue
            try:
                await self._on_client_message(client, message)
            except Exception:  # a bug must cost this message, not the frontend
                logger.exception("failed to handle %s from a client", type(message).__name__)
                await self._reply(client, ErrorReply(ErrorCode.INTERNAL, f"failed to handle {type(message).__name__}"))

    async def _workers_loop(self) -> None:
        while True:
            frames = await self.workers.recv_multipart(copy=False)
            identity = frames[0].bytes
            try:
                if len(frames) != 2:
                    raise ProtocolError(f"expected 1 frame, got {len(frames) - 1}")
                message = self._worker_decoder.decode(frames[1].buffer)
            except ProtocolError as e:
                logger.warning("bad frame from worker %r: %s", identity, e)
                continue
            if isinstance(message, Heartbeat):
                await self._on_heartbeat(identity, message)
            elif isinstance(message, StepResult):
                replica = self.replica_by_identity.get(identity)
                if replica is not None and identity == replica.identities.get(0):
                    replica.deliver(message)
            elif isinstance(message, WorkerHello):
                self.worker_connections.note_hello(identity, frames[1])
                self._on_hello(identity, message)

    async def _watchdog_loop(self) -> None:
        while True:
            await asyncio.sleep(min(1.0, self.worker_timeout_s / 4))
            now = time.monotonic()
            for replica in list(self.replicas.values()):
                if replica.silent_for(now) > self.worker_timeout_s:
                    logger.warning("worker %s silent for %.1f s: dropped", replica.name, replica.silent_for(now))
                    self._drop_replica(replica)

    async def _closed_workers_loop(self) -> None:
        while True:
            identity = await self.worker_connections.next_closed()
            replica = self.replica_by_identity.get(identity)
            if replica is not None:
                logger.warning("worker %s closed its connection: dropped", replica.name)
                self._drop_replica(replica)

    async def _on_heartbeat(self, identity: bytes, beat: Heartbeat) -> None:
        """Noted, and answered: known=False tells a worker this scheduler holds nothing of it."""
        replica = self.replica_by_worker_id.get(beat.worker_id)
        if replica is not None:
            replica.seen(beat.worker_id)
            replica.last_heartbeat[beat.worker_id] = beat
        try:
            await self.workers.send_multipart([identity, encode(HeartbeatReply(self.instance_id, replica is not None))],
                                              flags=zmq.NOBLOCK)
        except zmq.ZMQError:
            pass  # gone already

    async def _reply(self, client: bytes, message) -> bool:
        try:
            await self.frontend.send_multipart([client, encode(message)])
            return True
        except zmq.ZMQError as e:
            if e.errno != zmq.EHOSTUNREACH:
                raise
            self._on_client_gone(client)
            return False

    # ---- clients -------------------------------------------------------------------

    async def _on_client_message(self, client: bytes, message) -> None:
        if isinstance(message, Generate):
            self._on_generate(client, message)
        elif isinstance(message, Abort):
            for request_id in message.request_ids:
                self._abort(request_id, client)
        elif isinstance(message, ModelInfoQuery):
            await self._reply(client, self._model_info())
        elif isinstance(message, HealthQuery):
            await self._reply(client, self._health())
        await self.flush_outputs()

    def _on_generate(self, client: bytes, message: Generate) -> None:
        book = self.book
        for g in message.requests:
            refusal = self.admission.refusal(g, len(book), book.__contains__)
            if refusal is not None:
                self.outputs.add(client, error_output(g.request_id, len(g.prompt_token_ids), *refusal))
                continue
            request = Request(g.request_id, g.prompt_token_ids, g.params, g.priority, client=client, stream=g.stream)
            request.arrival = next(self._arrivals)
            self.book.add(request)
            self.pending.push(request)
            if self.metrics is not None:
                self.metrics.on_arrival(request.request_id)
        tune_gc_for_large_queues()  # keep the new requests out of the cyclic GC's scans
        self._wake_replicas()

    def _salvage(self, client: bytes, frame) -> bool:
        """A Generate with some invalid requests: run the valid ones, fail each invalid one alone."""
        salvaged = salvage_generate(frame)
        if salvaged is None:
            return False
        valid, invalid = salvaged
        for request_id, error in invalid:
            self.outputs.add(client, error_output(request_id, 0, ErrorCode.INVALID_PARAMS, error))
        self._on_generate(client, Generate(valid))
        return bool(valid or invalid)

    def _end(self, request: Request, reason: str, error: tuple[str, str] | None = None,
             new_token_ids: list[int] | None = None, new_logprobs: list | None = None) -> None:
        """The one way a live request ends here, from every path (a step's stop, length or
        error, an abort, a refusal, a vanished client, the drain): out of whichever queue holds
        it (its core frees its blocks and queues its id for the worker; `pending` skips it
        lazily), out of the book, counted, and its last output to its client.
        error: (code, message) for reason "error"; new_*: what its last step gave it."""
        if not request.is_finished:  # else its core ended it in a step, and said so in an update
            replica = self._replica_holding(request)
            if replica is not None:
                replica.core.abort(request.request_id, reason)
                replica.wakeup.set()  # its id must reach the worker in a (possibly free-only) plan
            else:
                request.mark_finished(reason)  # still in `pending`: skipped when it reaches the front
                self.pending.mark_removed()
        self.book.forget(request)
        if self.metrics is not None:
            self.metrics.on_end(request, reason)
        if reason == "error":
            assert error is not None, "an error ends a request with its code and message"
            output = error_output(request.request_id, request.num_prompt_tokens, *error)
        else:
            output = output_for(request, new_token_ids or [], new_logprobs, reason)
        if output is not None:
            self.outputs.add(request.client, output)

    def _replica_holding(self, request: Request) -> Replica | None:
        """The replica whose core holds the request; None while it waits in `pending`.
        O(replicas): each core is the one owner of what it holds."""
        for replica in self.replicas.values():
            if replica.core.get_request(request.request_id) is request:
                return replica
        return None

    def _abort(self, request_id: str, client: bytes | None) -> None:
        """A client's abort (or its vanishing): idempotent, and only of its own requests."""
        request = self.book.get(request_id)
        if request is None or (client is not None and request.client != client):
            return  # unknown, finished, or another client's id
        self._end(request, "abort")

    def fail_all(self, code: str, message: str) -> None:
        """Every live request ends with this error (the drain's end)."""
        for request_id in self.book.ids():
            self._end(self.book.get(request_id), "error", (code, message))

    def _on_client_gone(self, client: bytes) -> None:
        for request_id in self.book.ids_of(client):
            self._abort(request_id, None)
        self.outputs.drop(client)  # nobody to read them; other clients' outputs stay

    async def flush_outputs(self) -> None:
        for client, outputs in self.outputs.take().items():
            await self._reply(client, RequestOutputs(outputs))

    def _model_info(self) -> ModelInfo:
        return model_info(self.last_hello, len(self.replicas), self.admission.max_queued_requests, self.instance_id)

    def _health(self) -> Health:
        h = health(list(self.replicas.values()), len(self.pending), self.book.num_finished)
        h.instance_id, h.draining = self.instance_id, self.admission.draining
        return h

    # ---- workers -------------------------------------------------------------------

    def _on_hello(self, identity: bytes, hello: WorkerHello) -> None:
        old = self.replica_by_worker_id.get(hello.worker_id) or self.replica_by_identity.get(identity)
        if old is not None:
            self._drop_replica(old)  # a restarted worker: its old state is gone
        name = hello.group_id or hello.worker_id
        replica = self.replicas.get(name)
        if replica is None:
            replica = Replica(name, hello, self.config, self._arrivals)
            self.replicas[name] = replica
        replica.add_rank(hello.rank, identity, hello.worker_id)
        self.replica_by_worker_id[hello.worker_id] = replica
        self.replica_by_identity[identity] = replica
        self.last_hello = hello
        logger.info("worker %s joined: %s on %s, %d KV blocks, %d state slots", hello.worker_id, hello.model,
                    hello.device, hello.num_gpu_blocks, hello.num_state_slots)
        if replica.is_complete:
            self._spawn(self._drive(replica))

    def _drop_replica(self, replica: Replica) -> None:
        if self.replicas.get(replica.name) is not replica:
            return
        del self.replicas[replica.name]
        for worker_id in replica.worker_ids.values():
            self.replica_by_worker_id.pop(worker_id, None)
        for identity in replica.identities.values():
            self.replica_by_identity.pop(identity, None)
        replica.fail()
        # If it still lives (silent, not dead), it must not keep state we no longer track: a
        # supervisor (compose's restart policy, a user) restarts it and it joins afresh.
        self._spawn(self._send_shutdown(replica, "dropped by the scheduler"))
        # Recompute elsewhere: back to the front of pending, in the order they ran.
        requeued = replica.core.take_unfinished()
        for request in reversed(requeued):
            self.pending.push_front(request)
        logger.warning("replica %s dropped; %d requests requeued", replica.name, len(requeued))
        self._wake_replicas()

    def _wake_replicas(self) -> None:
        for replica in self.replicas.values():
            replica.wakeup.set()

    def _refill(self, replica: Replica) -> None:
        """Moves pending requests into the replica's core, up to a watermark of waiting ones;
        one the core refuses (scheduler_svc/validation.py) fails alone."""
        core, watermark = replica.core, 2 * self.config.max_num_seqs
        while core.num_waiting < watermark:
            request = self.pending.peek()
            if request is None:
                break
            try:
                core.add_request(request)
            except RequestRejected as e:
                self._end(request, "error", (e.code, e.message))  # still the head of `pending`
                continue
            self.pending.pop()  # the request peeked: now its core holds it

    async def _drive(self, replica: Replica) -> None:
        try:
            await self._step_loop(replica)
        except Exception:  # a bug in one replica's loop: recompute its requests elsewhere
            logger.exception("replica %s step loop failed", replica.name)
            self._drop_replica(replica)

    async def _step_loop(self, replica: Replica) -> None:
        """The step loop of one replica: plan, send, await the answer, apply it, emit outputs.
        With async scheduling the next plan is made and sent before the answer to the one in
        flight is awaited, so the worker finds it waiting when its step ends."""
        core = replica.core
        depth = self.config.plans_in_flight(replica.hello.device)
        while replica.alive:
            if core.num_plans_in_flight < depth:
                self._refill(replica)
                plan = core.schedule()
                if plan is not None:
                    replica.begin_step(plan)
                    payload = encode(plan)
                    for identity in replica.identities.values():
                        await self.workers.send_multipart([identity, payload])
                    continue
            if not core.num_plans_in_flight:
                await self.flush_outputs()
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
            await self.flush_outputs()

    def _apply(self, updates, step_error: str | None = None) -> None:
        metrics, now = self.metrics, time.monotonic()
        error = (ErrorCode.WORKER_ERROR, step_error or "the worker returned no token for this request")
        for update in updates:
            request = update.request
            if metrics is not None:
                metrics.on_tokens(request.request_id, len(update.new_token_ids), now)
            if update.finish_reason is not None:
                self._end(request, update.finish_reason, update.error or error, update.new_token_ids,
                          update.new_logprobs)
                continue
            output = output_for(request, update.new_token_ids, update.new_logprobs, None)
            if output is not None:
                self.outputs.add(request.client, output)
