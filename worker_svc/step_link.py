"""StepLink: the worker's step socket to the scheduler and the monitor of its handshake, one per
hello.

A worker that says hello again (the scheduler dropped it, or restarted) opens a new link: the
scheduler's ROUTER knows a new connection by a new identity, so it can only send there what
follows the new hello. Plans it sent on the old link belong to a membership it dropped (their
step ids start again at 0 in the replica it makes now) and are never read. The old link stays
open until the scheduler knows the worker again: closed earlier, its descriptor could be reused
by the new connection on the scheduler's side, and the old one's close be taken for the new
one's (scheduler_svc/worker_connections.py).
"""
import time

import zmq
from zmq.utils.monitor import parse_monitor_message

from protocol import AuthenticationError
from protocol.curve import HANDSHAKE_EVENTS, HandshakeRefusals


class StepLink:
    def __init__(self, sock: zmq.Socket, address: str, uses_curve: bool):
        """sock: a DEALER, not yet connected; connects to address."""
        self.sock = sock
        self.address = address
        self._monitor = sock.get_monitor_socket(HANDSHAKE_EVENTS)
        self._refusals = HandshakeRefusals(uses_curve)
        self._poller = zmq.Poller()
        self._poller.register(sock, zmq.POLLIN)
        self._poller.register(self._monitor, zmq.POLLIN)
        sock.connect(address)

    def receive(self, timeout_ms: int) -> zmq.Frame | None:
        """The next frame from the scheduler, or None after timeout_ms; AuthenticationError if it
        refuses this worker's key."""
        ready = dict(self._poller.poll(timeout_ms))
        if self._monitor in ready:
            event = parse_monitor_message(self._monitor.recv_multipart())["event"]
            failure = self._refusals.on_event(event, time.monotonic())
            if failure is not None:
                raise AuthenticationError(f"{failure} (scheduler at {self.address})")
        if self.sock not in ready:
            return None
        return self.sock.recv(copy=False)

    def close(self) -> None:
        self.sock.disable_monitor()
        self._monitor.close(linger=0)
        self.sock.close(linger=0)
