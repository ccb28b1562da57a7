"""The worker process's I/O: connect to the scheduler, say hello, run every plan it sends.

The main thread owns the step socket and the model; a heartbeat thread with its own socket
reports liveness and memory in use, so a long step does not look like a dead worker. The
scheduler answers each heartbeat: a scheduler that does not know this worker (it restarted, or
dropped the worker) gets a new hello, with every request of the old one forgotten first, so the
worker rejoins without a restart of its own.

Stopping (SIGTERM, SIGINT) is a drain: the worker keeps running the plans it is sent, so a
scheduler that drains too can finish its requests, and leaves when the scheduler says Shutdown,
when no plan came for IDLE_EXIT_S (nothing left for it, or no scheduler), or after
drain_timeout_s. It always finishes the step it is in.
"""
import logging
import threading
import time

import zmq
from zmq.utils.monitor import parse_monitor_message

from protocol import AuthenticationError, ProtocolError
from protocol.codec import encode, scheduler_to_worker_decoder
from protocol.curve import HANDSHAKE_EVENTS, ConnectingKeys, HandshakeRefusals, secure_connecting_socket
from protocol.worker_messages import Heartbeat, HeartbeatReply, Shutdown, StepPlan, StepResult, WorkerHello

logger = logging.getLogger("stepserve.worker")
IDLE_EXIT_S = 1.0  # draining with no plan for this long: nothing is left for this worker
UNKNOWN_FOR_S = 1.0  # heartbeats answered "unknown" for this long: say hello again


class WorkerService:
    def __init__(self, scheduler_address: str, runner, hello: WorkerHello, heartbeat_interval_s: float = 0.5,
                 answers: bool = True, curve_keys: ConnectingKeys | None = None, drain_timeout_s: float = 30.0):
        self.scheduler_address = scheduler_address
        self.runner = runner
        self.hello = hello
        self.heartbeat_interval_s = heartbeat_interval_s
        self.answers = answers  # in a tensor-parallel group only rank 0 answers steps
        self.curve_keys = curve_keys
        self.drain_timeout_s = drain_timeout_s
        self._stop = threading.Event()  # the threads end
        self._draining_since: float | None = None
        self._rejoin = threading.Event()  # set by the heartbeat thread
        self._ctx = zmq.Context()

    def _socket(self) -> zmq.Socket:
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        secure_connecting_socket(sock, self.curve_keys)
        return sock

    def serve(self) -> None:
        """Until Shutdown or the end of a drain; AuthenticationError if the scheduler refuses our key."""
        sock = self._socket()
        monitor = sock.get_monitor_socket(HANDSHAKE_EVENTS)
        refusals = HandshakeRefusals(uses_curve=self.curve_keys is not None)
        sock.connect(self.scheduler_address)
        sock.send(encode(self.hello))
        beats = threading.Thread(target=self._heartbeat_loop, name="heartbeat", daemon=True)
        beats.start()
        decoder = scheduler_to_worker_decoder()
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(monitor, zmq.POLLIN)
        last_step = time.monotonic()
        try:
            while not self._drained(last_step):
                if self._rejoin.is_set():
                    self._say_hello_again(sock)
                ready = dict(poller.poll(200))
                if monitor in ready:
                    event = parse_monitor_message(monitor.recv_multipart())["event"]
                    failure = refusals.on_event(event, time.monotonic())
                    if failure is not None:
                        raise AuthenticationError(f"{failure} (scheduler at {self.scheduler_address})")
                if sock not in ready:
                    continue
                try:
                    message = decoder.decode(sock.recv(copy=False).buffer)
                except ProtocolError as e:
                    logger.warning("bad frame from the scheduler: %s", e)
                    continue
                if isinstance(message, Shutdown):
                    logger.info("shutdown: %s", message.reason)
                    break
                if isinstance(message, StepPlan):
                    result = self._execute(message)
                    if self.answers:
                        sock.send(encode(result))
                    last_step = time.monotonic()
        finally:
            self._stop.set()
            beats.join(timeout=2)
            sock.disable_monitor()
            monitor.close(linger=0)
            sock.close(linger=0)
            self._ctx.term()

    def stop(self) -> None:
        """Begin the drain (a signal handler)."""
        if self._draining_since is None:
            self._draining_since = time.monotonic()
            logger.info("draining: leaving when the scheduler says so, when idle, or in %.0f s", self.drain_timeout_s)

    def _drained(self, last_step: float) -> bool:
        if self._draining_since is None:
            return False
        now = time.monotonic()
        return (now - max(last_step, self._draining_since) > IDLE_EXIT_S
                or now - self._draining_since > self.drain_timeout_s)

    def _say_hello_again(self, sock: zmq.Socket) -> None:
        """To a scheduler that holds nothing of us: forget every request first (they are not ours
        any more; that scheduler never scheduled them), then join as a new worker."""
        self._rejoin.clear()
        held = list(self.runner.requests.row_of)
        if held:
            self.runner.execute(StepPlan(step_id=-1, finished_ids=held, preempted_ids=[], new_requests=[],
                                         running_requests=[]))
        sock.send(encode(self.hello))
        logger.info("said hello again (%d requests of the old scheduler forgotten)", len(held))

    def _execute(self, plan: StepPlan) -> StepResult:
        start = time.perf_counter()
        try:
            result = self.runner.execute(plan)
        except Exception as e:  # the runner reports its own failures; this is the last net
            logger.exception("step %d failed", plan.step_id)
            result = StepResult(plan.step_id, [], error=f"{type(e).__name__}: {e}")
        result.busy_s = time.perf_counter() - start  # the scheduler's worker_busy_fraction
        return result

    def _heartbeat_loop(self) -> None:
        sock = self._socket()
        sock.connect(self.scheduler_address)
        decoder = scheduler_to_worker_decoder()
        instance_id, unknown_since = None, None
        next_beat = time.monotonic()
        try:
            while not self._stop.is_set():
                now = time.monotonic()
                if now >= next_beat:
                    sock.send(encode(Heartbeat(worker_id=self.hello.worker_id, **self.runner.stats())))
                    next_beat = now + self.heartbeat_interval_s
                if not sock.poll(max(1, int(1000 * (next_beat - now)))):
                    continue
                try:
                    reply = decoder.decode(sock.recv())
                except ProtocolError as e:
                    logger.warning("bad heartbeat reply: %s", e)
                    continue
                if not isinstance(reply, HeartbeatReply):
                    continue
                if reply.instance_id != instance_id:
                    if instance_id is not None:
                        logger.warning("scheduler instance %s replaced %s", reply.instance_id, instance_id)
                    instance_id = reply.instance_id
                if reply.known:
                    unknown_since = None
                elif unknown_since is None:
                    unknown_since = time.monotonic()  # maybe our hello is just behind this beat
                elif time.monotonic() - unknown_since > UNKNOWN_FOR_S and not self._rejoin.is_set():
                    logger.warning("scheduler %s does not know this worker: joining again", instance_id)
                    self._rejoin.set()
                    unknown_since = None
        finally:
            sock.close(linger=0)
