"""The worker process's I/O: connect to the scheduler, say hello, run every plan it sends.

The main thread owns the step socket and the model; a heartbeat thread with its own socket
reports liveness and memory in use, so a long step does not look like a dead worker.
"""
import logging
import threading

import zmq

from protocol import ProtocolError
from protocol.codec import encode, scheduler_to_worker_decoder
from protocol.worker_messages import Heartbeat, Shutdown, StepPlan, StepResult, WorkerHello

logger = logging.getLogger("stepserve.worker")


class WorkerService:
    def __init__(self, scheduler_address: str, runner, hello: WorkerHello, heartbeat_interval_s: float = 0.5,
                 answers: bool = True):
        self.scheduler_address = scheduler_address
        self.runner = runner
        self.hello = hello
        self.heartbeat_interval_s = heartbeat_interval_s
        self.answers = answers  # in a tensor-parallel group only rank 0 answers steps
        self._stop = threading.Event()
        self._ctx = zmq.Context()

    def serve(self) -> None:
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self.scheduler_address)
        sock.send(encode(self.hello))
        beats = threading.Thread(target=self._heartbeat_loop, name="heartbeat", daemon=True)
        beats.start()
        decoder = scheduler_to_worker_decoder()
        try:
            while not self._stop.is_set():
                if not sock.poll(200):
                    continue
                try:
                    message = decoder.decode(sock.recv(copy=False).buffer)
                except ProtocolError as e:
                    logger.warning("bad frame from the scheduler: %s", e)
                    continue
                if isinstance(message, Shutdown):
                    logger.info("shutdown: %s", message.reason)
                    break
                result = self._execute(message)
                if self.answers:
                    sock.send(encode(result))
        finally:
            self._stop.set()
            beats.join(timeout=2)
            sock.close(linger=0)
            self._ctx.term()

    def stop(self) -> None:
        self._stop.set()

    def _execute(self, plan: StepPlan) -> StepResult:
        try:
            return self.runner.execute(plan)
        except Exception as e:  # the runner reports its own failures; this is the last net
            logger.exception("step %d failed", plan.step_id)
            return StepResult(plan.step_id, [], error=f"{type(e).__name__}: {e}")

    def _heartbeat_loop(self) -> None:
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self.scheduler_address)
        try:
            while not self._stop.wait(self.heartbeat_interval_s):
                sock.send(encode(Heartbeat(worker_id=self.hello.worker_id, **self.runner.stats())))
        finally:
            sock.close(linger=0)
