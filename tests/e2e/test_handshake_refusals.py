"""A refused handshake against one that merely closed: what a client or worker makes of its
socket monitor's events (protocol.curve.HandshakeRefusals), and, with real sockets, an open
client behind a port forwarder with nothing behind it yet (docker's userland proxy while the
scheduler's container starts: it accepts, then hangs up) that is served once the scheduler is
there, never refused."""
import asyncio
import socket
import threading

import zmq

from client_sdk import AsyncClient
from protocol.curve import CLOSED_IN_HANDSHAKE_GRACE_S, HandshakeRefusals
from stepserve.launcher import LocalCluster

CLOSED = zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL


def test_a_refusal_is_told_at_once_and_a_closed_handshake_never_without_keys():
    refusals = HandshakeRefusals(uses_curve=False)
    assert all(refusals.on_event(CLOSED, now) is None for now in range(100))
    assert "refused this side's CurveZMQ key" in refusals.on_event(zmq.EVENT_HANDSHAKE_FAILED_AUTH, 100)
    assert "one side uses CurveZMQ" in HandshakeRefusals(False).on_event(zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, 0)


def test_with_keys_a_closed_handshake_is_a_refusal_once_it_lasts_the_grace():
    refusals = HandshakeRefusals(uses_curve=True)
    grace = CLOSED_IN_HANDSHAKE_GRACE_S
    assert refusals.on_event(CLOSED, 0.0) is None
    assert refusals.on_event(CLOSED, grace - 0.1) is None
    assert refusals.on_event(zmq.EVENT_HANDSHAKE_SUCCEEDED, grace) is None  # a success starts it over
    assert refusals.on_event(CLOSED, grace + 1) is None
    assert refusals.on_event(CLOSED, 2 * grace) is None
    assert "is curve_server_key the scheduler's public key" in refusals.on_event(CLOSED, 2 * grace + 1)


def accept_and_hang_up(listener: socket.socket, stop: threading.Event, hung_up: list) -> None:
    listener.settimeout(0.05)
    while not stop.is_set():
        try:
            listener.accept()[0].close()
            hung_up.append(1)
        except TimeoutError:
            pass


async def test_an_open_client_behind_a_forwarder_waits_for_the_scheduler_instead_of_being_refused():
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    stop, hung_up = threading.Event(), []
    forwarder = threading.Thread(target=accept_and_hang_up, args=(listener, stop, hung_up))
    forwarder.start()
    async with AsyncClient(f"tcp://127.0.0.1:{port}", timeout_s=30) as client:
        health = asyncio.ensure_future(client.health())
        while len(hung_up) < 3:  # handshakes closed under it (a reconnection every 0.1 s)
            await asyncio.sleep(0.01)
        await asyncio.sleep(0)
        assert not health.done()
        stop.set()
        forwarder.join()
        listener.close()
        with LocalCluster("unused", 0, frontend=f"tcp://127.0.0.1:{port}") as cluster:
            assert cluster.address == f"tcp://127.0.0.1:{port}"
            assert (await health).num_workers == 0
