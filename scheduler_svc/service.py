"""The scheduler process: ZeroMQ sockets and asyncio loops around the sans-IO core, and the
dispatch of what arrives on them.

Clients (DEALER) -> ROUTER frontend; workers (DEALER) -> ROUTER workers. Requests wait in
`pending` until a replica has room; each replica's step loop (step_loop.py) then moves them into
its core, which plans its steps, or routes them to the replica caching their prefix (routing.py). The replicas are a ReplicaSet (replica_set.py); a dropped
replica's requests go back to the front of `pending`.

Operating it: CurveZMQ and the open-port warning (auth.py), backpressure (admission.py), the
drain on SIGTERM (drain.py), crashed workers noticed by their closed connection
(worker_connections.py), silent ones dropped after --worker-timeout (the unhealthy replicas of
/health until they rejoin), and an instance id in every heartbeat reply, so that workers of a
restarted scheduler say hello again.
"""
import asyncio
import logging
import time
import uuid

import zmq
import zmq.asyncio

from protocol import ErrorCode, ProtocolError
from protocol.client_messages import (Abort, ErrorReply, Generate, Health, HealthQuery,
                                      ModelInfo, ModelInfoQuery, RequestOutputs)
from protocol.codec import client_to_scheduler_decoder, encode, salvage_generate, worker_to_scheduler_decoder
from protocol.worker_messages import Heartbeat, HeartbeatReply, Shutdown, StepPlan, StepResult, WorkerHello
from scheduler_svc.admission import DEFAULT_MAX_QUEUED_REQUESTS, Admission
from scheduler_svc.auth import FrontDoor
from scheduler_svc.config import SchedulerConfig
from scheduler_svc.drain import Drain
from scheduler_svc.live_requests import LiveRequests
from scheduler_svc.metrics import SchedulerMetrics
from scheduler_svc.replica import Replica
from scheduler_svc.replica_set import ReplicaSet
from scheduler_svc.stats import health, model_info
from scheduler_svc.step_loop import ReplicaDriver
from scheduler_svc.worker_connections import WorkerConnections

logger = logging.getLogger("stepserve.scheduler")


class SchedulerService:
    def __init__(self, frontend_address: str, worker_address: str, config: SchedulerConfig,
                 worker_timeout_s: float = 10.0, max_message_bytes: int = 256 << 20,
                 check_integrity_when_idle: bool = True, enable_metrics: bool = False,
                 max_queued_requests: int = DEFAULT_MAX_QUEUED_REQUESTS, drain_timeout_s: float = 30.0,
                 front_door: FrontDoor | None = None, step_timeout_s: float = 300.0):
        self.config = config
        self.instance_id = uuid.uuid4().hex[:12]  # new on every start: workers and clients tell a restart
        self.admission = Admission(max_queued_requests)
        self.front_door = front_door or FrontDoor()
        # Prometheus metrics (--metrics-port); None when off, and then they cost nothing.
        self.metrics = SchedulerMetrics(self._health) if enable_metrics else None
        self.frontend_address = frontend_address
        self.worker_address = worker_address
        self.worker_timeout_s = worker_timeout_s
        self.step_timeout_s = step_timeout_s
        self.max_message_bytes = max_message_bytes
        self.check_integrity_when_idle = check_integrity_when_idle
        self.replicas = ReplicaSet(config)
        self.requests = LiveRequests(config, self.admission, self.replicas, self.metrics)
        self.drain = Drain(self.admission, self.requests, self.replicas, flush_outputs=self.flush_outputs,
                           stop=self.stop, timeout_s=drain_timeout_s)
        self._client_decoder = client_to_scheduler_decoder()
        self._worker_decoder = worker_to_scheduler_decoder()
        self._tasks: set[asyncio.Task] = set()
        self._stopping = asyncio.Event()

    # ---- sockets and loops ---------------------------------------------------------

    def bind(self) -> tuple[str, str]:
        self.ctx = zmq.asyncio.Context()
        self.front_door.open(self.ctx)  # before any bind: every handshake is checked
        self.frontend = self._router(self.frontend_address)
        self.workers = self._router(self.worker_address)
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
        for replica in self.replicas:
            await self._send_shutdown(replica, "scheduler stopping")

    async def _send_plan(self, replica: Replica, plan: StepPlan) -> None:
        payload = encode(plan)
        for identity in replica.identities.values():
            await self.workers.send_multipart([identity, payload])

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
                replica = self.replicas.by_identity(identity)
                if replica is not None and identity == replica.identities.get(0):
                    replica.deliver(message)
            elif isinstance(message, WorkerHello):
                self.worker_connections.note_hello(identity, frames[1])
                self._on_hello(identity, message)

    async def _watchdog_loop(self) -> None:
        while True:
            await asyncio.sleep(min(1.0, self.worker_timeout_s / 4))
            now = time.monotonic()
            for replica in list(self.replicas):  # a copy: it drops some
                stall = self._stall(replica, now)
                if stall is not None:
                    logger.warning("worker %s %s: dropped until it says hello again", replica.name, stall)
                    self.drop_replica(replica)
                    self.replicas.mark_stalled(replica)

    def _stall(self, replica: Replica, now: float) -> str | None:
        """Why the replica's worker counts as stalled, or None: silent past --worker-timeout, or
        beating but one step unanswered past --step-timeout."""
        silent, waiting = replica.silent_for(now), replica.step_waiting_for(now)
        if silent > self.worker_timeout_s:
            return f"silent for {silent:.1f} s"
        if waiting > self.step_timeout_s:
            return f"has not answered a step for {waiting:.1f} s (--step-timeout {self.step_timeout_s:g})"
        return None

    async def _closed_workers_loop(self) -> None:
        while True:
            identity = await self.worker_connections.next_closed()
            self.replicas.connection_closed(identity)
            replica = self.replicas.by_identity(identity)
            if replica is not None:
                logger.warning("worker %s closed its connection: dropped", replica.name)
                self.drop_replica(replica)

    async def _on_heartbeat(self, identity: bytes, beat: Heartbeat) -> None:
        """Noted, and answered: known=False tells a worker this scheduler holds nothing of it."""
        replica = self.replicas.by_worker_id(beat.worker_id)
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
            self.requests.client_gone(client)
            return False

    # ---- clients -------------------------------------------------------------------

    async def _on_client_message(self, client: bytes, message) -> None:
        if isinstance(message, Generate):
            self._on_generate(client, message)
        elif isinstance(message, Abort):
            for request_id in message.request_ids:
                self.requests.abort(request_id, client)
        elif isinstance(message, ModelInfoQuery):
            await self._reply(client, self._model_info())
        elif isinstance(message, HealthQuery):
            await self._reply(client, self._health())
        await self.flush_outputs()

    def _on_generate(self, client: bytes, message: Generate) -> None:
        self.requests.admit(client, message.requests)
        self._wake_replicas()

    def _salvage(self, client: bytes, frame) -> bool:
        """A Generate with some invalid requests: run the valid ones, fail each invalid one alone."""
        salvaged = salvage_generate(frame)
        if salvaged is None:
            return False
        valid, invalid = salvaged
        self.requests.refuse_invalid(client, invalid)
        self._on_generate(client, Generate(valid))
        return bool(valid or invalid)

    async def flush_outputs(self) -> None:
        for client, outputs in self.requests.outputs.take().items():
            await self._reply(client, RequestOutputs(outputs))

    def _model_info(self) -> ModelInfo:
        return model_info(self.replicas.hello(), len(self.replicas), self.admission.max_queued_requests,
                          self.instance_id)

    def _health(self) -> Health:
        h = health(list(self.replicas), self.requests.num_waiting, self.requests.book.num_finished)
        h.instance_id, h.draining = self.instance_id, self.admission.draining
        h.unhealthy_replicas = self.replicas.stalled_names
        return h

    # ---- workers -------------------------------------------------------------------

    def _on_hello(self, identity: bytes, hello: WorkerHello) -> None:
        old = self.replicas.by_worker_id(hello.worker_id) or self.replicas.by_identity(identity)
        if old is not None:
            self.drop_replica(old)  # a restarted worker: its old state is gone
        replica = self.replicas.join(identity, hello)
        logger.info("worker %s joined: %s on %s, %d KV blocks, %d state slots", hello.worker_id, hello.model,
                    hello.device, hello.num_gpu_blocks, hello.num_state_slots)
        if replica.is_complete:
            driver = ReplicaDriver(replica, self.replicas, self.config, self.requests, send_plan=self._send_plan,
                                   flush_outputs=self.flush_outputs, drop_replica=self.drop_replica,
                                   metrics=self.metrics, check_integrity_when_idle=self.check_integrity_when_idle)
            self._spawn(driver.run())

    def drop_replica(self, replica: Replica) -> None:
        if not self.replicas.remove(replica):
            return
        replica.fail()
        # A worker that still lives (silent, not dead) is not told to exit: its heartbeats, once
        # it answers again, hear that it is unknown, and it forgets every request, then rejoins.
        num_requeued = self.requests.requeue(replica)
        logger.warning("replica %s dropped; %d requests requeued", replica.name, num_requeued)
        self._wake_replicas()

    def _wake_replicas(self) -> None:
        for replica in self.replicas:
            replica.wakeup.set()
