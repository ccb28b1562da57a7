"""The scheduler's front door: CurveZMQ on both sockets, a ZAP authenticator that accepts only the
public keys in --curve-authorized-keys, and a warning when a socket is open to the network.

The authenticator runs on the scheduler's own asyncio loop (pyzmq's AsyncioAuthenticator): a
handshake is one ZAP request over inproc, answered between steps like any other message. A
refused client or worker is told so by its handshake (EVENT_HANDSHAKE_FAILED_AUTH on its side);
nothing of it reaches the service.
"""
import ipaddress
import logging
from urllib.parse import urlparse

import zmq
import zmq.auth
from zmq.auth.asyncio import AsyncioAuthenticator

from protocol.curve import scheduler_keys, secure_bound_socket

logger = logging.getLogger("stepserve.scheduler")


def is_loopback(address: str) -> bool:
    """tcp://127.0.0.1:5555 or tcp://localhost:* yes; tcp://0.0.0.0:5555, tcp://*:5555 no;
    ipc:// and inproc:// never leave the host."""
    parsed = urlparse(address)
    if parsed.scheme != "tcp":
        return True
    host = address.split("://", 1)[1].rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # '*', an interface name, a host name: reachable from elsewhere


class FrontDoor:
    def __init__(self, secret_key: str | None = None, authorized_keys: str | None = None):
        """secret_key: the scheduler's secret certificate; authorized_keys: a folder of the
        public certificates it accepts. Neither (nor STEPSERVE_CURVE_KEYS): an open service."""
        self.key_pair, self.authorized_keys = scheduler_keys(secret_key, authorized_keys)
        self._authenticator: AsyncioAuthenticator | None = None

    @property
    def secured(self) -> bool:
        return self.key_pair is not None

    def open(self, ctx: zmq.asyncio.Context) -> None:
        """Before any bind: from now on every handshake is checked."""
        if self.key_pair is None:
            return
        self._authenticator = AsyncioAuthenticator(ctx)
        self._authenticator.start()
        if self.authorized_keys:
            self._authenticator.configure_curve(domain="*", location=self.authorized_keys)
            logger.info("CurveZMQ on: %d authorized keys in %s", len(zmq.auth.load_certificates(self.authorized_keys)),
                        self.authorized_keys)
        else:
            self._authenticator.configure_curve(domain="*", location=zmq.auth.CURVE_ALLOW_ANY)
            logger.warning("CurveZMQ encrypts, but with no --curve-authorized-keys any client or worker that knows "
                           "the scheduler's public key is accepted")

    def prepare(self, sock: zmq.Socket, address: str) -> None:
        """Before sock.bind(address)."""
        secure_bound_socket(sock, self.key_pair)
        if not self.secured and not is_loopback(address):
            logger.warning("%s is bound without CurveZMQ keys: the service is OPEN to anyone who can reach it "
                           "(give --curve-secret-key and --curve-authorized-keys; see `stepserve keys generate`)",
                           address)

    def close(self) -> None:
        if self._authenticator is not None:
            self._authenticator.stop()
            self._authenticator = None
