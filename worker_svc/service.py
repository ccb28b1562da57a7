"""The worker process's I/O: connect to the scheduler, say hello, run every plan it sends.

The main thread owns the step link (step_link.py) and the model; a heartbeat thread with its
own socket reports liveness and memory in use, so a long step does not look like a dead worker.
The scheduler answers each heartbeat: a scheduler that does not know this worker (it restarted,
or dropped the worker: a stop, a swap storm, a debugger kept it silent past --worker-timeout)
gets a new hello on a new link, with every request of the old membership forgotten first, so the
worker rejoins without a restart of its own and holds no state for requests the scheduler moved.

Stopping (SIGTERM, SIGINT) is a drain: the worker keeps running the plans it is sent, so a
scheduler that drains too can finish its requests, and leaves when the scheduler says Shutdown,
when no plan came for IDLE_EXIT_S (nothing left for it, or no scheduler), or after
drain_timeout_s. It always finishes the step it is in.
"""
import logging
import threading
import time

import zmq

from protocol import ProtocolError
from protocol.codec import encode, scheduler_to_worker_decoder
from protocol.curve import ConnectingKeys, secure_connecting_socket
from protocol.worker_messages import Heartbeat, HeartbeatReply, Shutdown, StepPlan, StepResult, WorkerHello
from worker_svc.step_link import StepLink

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
        self._known = threading.Event()  # the scheduler's last heartbeat reply knew this worker
        self._retired: list[StepLink] = []  # links of an earlier hello, closed once known again
        self._ctx = zmq.Context()

    def _socket(self) -> zmq.Socket:
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        secure_connecting_socket(sock, self.curve_keys)
        return sock

    def serve(self) -> None:
        """Until Shutdown or the end of a drain; AuthenticationError if the scheduler refuses our key."""
        link = self._open_link()
        beats = threading.Thread(target=self._heartbeat_loop, name="heartbeat", daemon=True)
        beats.start()
        decoder = scheduler_to_worker_decoder()
        last_step = time.monotonic()
        try:
            while not self._drained(last_step):
                if self._rejoin.is_set():
                    link = self._say_hello_again(link)
                if self._retired and self._known.is_set():
                    self._close_retired()
                frame = link.receive(200)
                if frame is None:
                    continue
                try:
                    message = decoder.decode(frame.buffer)
                except ProtocolError as e:
                    logger.warning("bad frame from the scheduler: %s", e)
                    continue
                if isinstance(message, Shutdown):
                    logger.info("shutdown: %s", message.reason)
                    break
                if isinstance(message, StepPlan):
                    result = self._execute(message)
                    if self.answers:
                        link.sock.send(encode(result))
                    last_step = time.monotonic()
        finally:
            self._stop.set()
            beats.join(timeout=2)
            self._close_retired()
            link.close()
            self._ctx.term()

    def _open_link(self) -> StepLink:
        """A new step link, with this worker's hello on it."""
        link = StepLink(self._socket(), self.scheduler_address, uses_curve=self.curve_keys is not None)
        link.sock.send(encode(self.hello))
        return link

    def _close_retired(self) -> None:
        for link in self._retired:
            link.close()
        self._retired.clear()

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

    def _say_hello_again(self, link: StepLink) -> StepLink:
        """To a scheduler that holds nothing of us: forget every request first (that scheduler
        requeued them elsewhere, or never scheduled them), then join as a new worker on a new link."""
        self._rejoin.clear()
        self._known.clear()
        held = list(self.runner.requests.row_of)
        if held:
            self.runner.execute(StepPlan(step_id=-1, finished_ids=held, preempted_ids=[], new_requests=[],
                                         running_requests=[]))
        self._retired.append(link)
        logger.info("saying hello again (%d requests of the old membership forgotten)", len(held))
        return self._open_link()

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
                    self._known.set()
                    continue
                self._known.clear()
                if unknown_since is None:
                    unknown_since = time.monotonic()  # maybe our hello is just behind this beat
                elif time.monotonic() - unknown_since > UNKNOWN_FOR_S and not self._rejoin.is_set():
                    logger.warning("scheduler %s does not know this worker: joining again", instance_id)
                    self._rejoin.set()
                    unknown_since = None
        finally:
            sock.close(linger=0)
