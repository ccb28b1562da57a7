"""Which worker's connection closed: a crashed worker is noticed at once, not after
--worker-timeout of heartbeat silence (that timeout stays, for a worker that hangs alive).

A ROUTER names no peer when a connection closes; its socket monitor tells the connection's file
descriptor, and every message carries the descriptor it came on (zmq.SRCFD). A worker's hello
maps its descriptor to its identity; a DISCONNECTED event for that descriptor is that worker gone.
"""
import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message


class WorkerConnections:
    def __init__(self, sock: zmq.asyncio.Socket):
        self._sock = sock
        self._monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        self._identity_of_fd: dict[int, bytes] = {}

    def note_hello(self, identity: bytes, frame: zmq.Frame) -> None:
        self._identity_of_fd[frame.get(zmq.SRCFD)] = identity

    async def next_closed(self) -> bytes | None:
        """Waits for a closed connection: the identity of the worker that said hello on it, or
        None for a connection that never did (a heartbeat socket, a stranger)."""
        event = parse_monitor_message(await self._monitor.recv_multipart())
        return self._identity_of_fd.pop(int(event["value"]), None)

    def close(self) -> None:
        self._sock.disable_monitor()
        self._monitor.close(linger=0)
