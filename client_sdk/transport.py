"""Transport: one ZeroMQ DEALER socket to the scheduler's frontend, shared by every request of a client.

One reader task receives every frame and hands each output to the sink registered for its
scheduler request id (a stream's queue, a batch's collector), so any number of requests share
the socket. The same task reads the socket's monitor (connection.py): a refused handshake or a
closed connection fails the live requests at once. With request_timeout_s a second task fails
the requests not finished in time (deadlines.py). Queries (model info, health) wait for their
reply type in send order.

Aborts sent in the background (abort_soon) are the transport's own tasks: once the client is
closed they are not sent at all (the scheduler aborts the requests of a client it cannot reach),
and a failure to send one is logged once, never left in a task nobody awaits.
"""
import asyncio
import logging
import weakref
from collections import deque
from typing import Callable

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from client_sdk.connection import MONITORED_EVENTS, ConnectionState
from client_sdk.deadlines import Deadlines
from client_sdk.errors import ServiceError
from protocol.client_messages import Abort, ErrorReply, Generate, GenerateRequest, Health, ModelInfo, RequestOutputs
from protocol.client_messages import RequestOutput as WireOutput
from protocol.codec import encode, scheduler_to_client_decoder
from protocol.curve import connecting_keys, secure_connecting_socket
from protocol.errors import ErrorCode
from protocol.limits import MAX_REQUESTS_PER_MESSAGE

Sink = Callable[[WireOutput], None]
logger = logging.getLogger("stepserve.client")


def _release(ctx: zmq.asyncio.Context, sock: zmq.asyncio.Socket, monitor: zmq.asyncio.Socket) -> None:
    """Closes the sockets, then the context: a context collected with a socket open would block
    in term(), so a client dropped without close() releases them through a finalizer."""
    if not sock.closed:
        sock.disable_monitor()
    monitor.close(linger=0)
    sock.close(linger=0)
    ctx.term()


def error_output(request_id: str, code: str, message: str) -> WireOutput:
    return WireOutput(request_id, [], 0, "error", None, code, message)


class Transport:
    def __init__(self, address: str, *, request_timeout_s: float | None, curve_server_key: str | None,
                 curve_secret_key: str | None):
        """The arguments of AsyncClient, which documents them."""
        self.address = address
        self._ctx = zmq.asyncio.Context()
        self._sock = self._ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.SNDHWM, 0)
        self._sock.setsockopt(zmq.RCVHWM, 0)
        keys = connecting_keys("client", curve_server_key, curve_secret_key)
        secure_connecting_socket(self._sock, keys)
        self._monitor = self._sock.get_monitor_socket(MONITORED_EVENTS)
        self._release = weakref.finalize(self, _release, self._ctx, self._sock, self._monitor)
        self._connection = ConnectionState(address, uses_curve=keys is not None)
        self._sock.connect(address)
        self._deadlines = Deadlines(request_timeout_s, self._on_timeouts) if request_timeout_s else None
        self._deadline_task: asyncio.Task | None = None
        self._decoder = scheduler_to_client_decoder()
        self.sinks: dict[str, Sink] = {}  # a live scheduler request id -> who takes its outputs
        self._queries: dict[type, deque[asyncio.Future]] = {ModelInfo: deque(), Health: deque()}
        self._reader: asyncio.Task | None = None
        self._background: set[asyncio.Task] = set()  # aborts on their way (abort_soon)
        self._closed = False
        self._abort_failure_logged = False

    def start(self) -> None:
        """Raises the refused handshake's error, if any; else starts the reader once."""
        self.raise_if_refused()
        if self._reader is None:
            loop = asyncio.get_running_loop()
            self._reader = loop.create_task(self._read_loop())
            if self._deadlines is not None:
                self._deadline_task = loop.create_task(self._deadlines.run())

    def raise_if_refused(self) -> None:
        if self._connection.auth_error is not None:
            raise self._connection.auth_error

    async def _read_loop(self) -> None:
        poller = zmq.asyncio.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poller.register(self._monitor, zmq.POLLIN)
        while True:
            ready = dict(await poller.poll())
            # Every message first: a closed connection's last outputs are queued before its event.
            while True:
                try:
                    frame = await self._sock.recv(flags=zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    break
                self._dispatch(self._decoder.decode(frame.buffer))
            if self._monitor in ready:
                event = parse_monitor_message(await self._monitor.recv_multipart())["event"]
                lost = self._connection.on_event(event)
                if lost is not None:
                    self._fail_live(*lost)

    def _dispatch(self, message) -> None:
        if isinstance(message, RequestOutputs):
            for output in message.outputs:
                sink = self.sinks.get(output.request_id)
                if sink is not None:
                    sink(output)
        elif isinstance(message, ErrorReply):
            self._fail_queries(ServiceError(message.code, message.message))
        else:
            waiting = self._queries[type(message)]
            if waiting:
                future = waiting.popleft()
                if not future.done():
                    future.set_result(message)

    def _fail_queries(self, error: Exception) -> None:
        for waiting in self._queries.values():
            while waiting:
                future = waiting.popleft()
                if not future.done():
                    future.set_exception(error)

    def _fail_live(self, code: str, message: str) -> None:
        """Every live request and query ends with this error (the connection lost them)."""
        ids = list(self.sinks)
        for request_id in ids:
            sink = self.sinks.get(request_id)
            if sink is not None:
                sink(error_output(request_id, code, message))
        self._fail_queries(self._connection.auth_error or ServiceError(code, message))
        if ids and code != ErrorCode.AUTHENTICATION_FAILED:
            self.abort_soon(ids)  # one still in the socket's queue must not run on the new scheduler

    def _on_timeouts(self, expired: list[tuple[str, object]]) -> None:
        timed_out = []
        for request_id, sink in expired:
            if self.sinks.get(request_id) is sink:
                timed_out.append(request_id)
                sink(error_output(request_id, ErrorCode.TIMEOUT,
                                   f"not finished within request_timeout_s ({self._deadlines.timeout_s:g} s)"))
        if timed_out:
            self.abort_soon(timed_out)

    async def query(self, query, reply_type: type, timeout_s: float | None):
        """The reply, or the error that ends the wait: the send's, a refused handshake's (the reader
        fails the query's future even while the send still waits: a DEALER whose handshake failed
        has no peer to queue to, so its send waits for a connection that never comes), or a
        timeout after timeout_s for the send and the reply together."""
        self.start()
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        future = loop.create_future()
        self._queries[reply_type].append(future)
        sending = asyncio.ensure_future(self._sock.send(encode(query)))
        waiting = {sending, future}
        try:
            while not future.done():
                remaining = None if deadline is None else max(0.0, deadline - loop.time())
                done, waiting = await asyncio.wait(waiting, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
                if not done:
                    raise ServiceError("timeout", f"no reply from {self.address} in {timeout_s} s")
                if sending in done and not future.done():
                    sending.result()  # the send's own error, if it had one
            return future.result()
        finally:
            for pending in (sending, future):
                if not pending.done():
                    pending.cancel()
                elif not pending.cancelled():
                    pending.exception()  # retrieved: raised above, or superseded by the other's

    def claim(self, request_ids: list[str]) -> None:
        """One live request per id on this client: a second would steal the first's outputs."""
        taken = [rid for rid in request_ids if rid in self.sinks]
        if taken or len(set(request_ids)) != len(request_ids):
            raise ValueError(f"request ids already in use on this client: {taken or 'duplicates in the batch'}")

    async def send_requests(self, requests: list[GenerateRequest]) -> None:
        if self._deadlines is not None:
            self._deadlines.add([(r.request_id, self.sinks.get(r.request_id)) for r in requests])
        for start in range(0, len(requests), MAX_REQUESTS_PER_MESSAGE):
            await self._sock.send(encode(Generate(requests[start:start + MAX_REQUESTS_PER_MESSAGE])))

    async def send_abort(self, request_ids: list[str]) -> None:
        """Nothing to send once the socket is closed: the scheduler aborts what a vanished client
        asked for."""
        if not self._sock.closed:
            await self._sock.send(encode(Abort(request_ids)))

    def abort_soon(self, request_ids: list[str]) -> None:
        """An abort that must not wait, nor be lost to a cancellation: from a finally block of a
        cancelled stream (a client that went away), or from the reader (a stop string matched)."""
        if self._closed:  # close() sends the ones asked for before it, and no later one
            return
        task = asyncio.get_running_loop().create_task(self.send_abort(request_ids))
        self._background.add(task)
        task.add_done_callback(self._abort_sent)

    def _abort_sent(self, task: asyncio.Task) -> None:
        self._background.discard(task)
        error = None if task.cancelled() else task.exception()
        if error is not None and not self._abort_failure_logged:
            self._abort_failure_logged = True
            logger.warning("an abort could not be sent to %s (further failures are not logged): %r",
                           self.address, error)

    async def close(self) -> None:
        self._closed = True
        if self._background:  # the last aborts; a socket that never connected cannot send them
            _, unsent = await asyncio.wait(self._background, timeout=1.0)
            for task in unsent:
                task.cancel()
        for task in (self._reader, self._deadline_task):
            if task is not None:
                task.cancel()
                try:
                    await task
                except (asyncio.CancelledError, Exception):
                    pass
        self._release()
