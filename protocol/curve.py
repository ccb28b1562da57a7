"""CurveZMQ on the wire: key pairs in pyzmq's certificate files, set on the sockets of either
end, and what a failed handshake means. Both links (clients and workers) use it alike.

`stepserve keys generate DIR` writes DIR/scheduler.key + scheduler.key_secret, the same for
`client` and `worker`, and DIR/authorized/ holding the client's and the worker's public
certificates. The scheduler (the CURVE server) holds its secret certificate and accepts the
public certificates in an authorized folder; a client or a worker holds the scheduler's public
certificate and a secret certificate of its own.

Where a connecting side finds its keys, the first that is set wins: explicit paths (flags,
arguments); STEPSERVE_CURVE_SERVER_KEY + STEPSERVE_CURVE_SECRET_KEY; STEPSERVE_CURVE_KEYS, a
folder written by `stepserve keys generate`, from which each process takes its own role's files
(so one variable turns CurveZMQ on for every service of compose.yaml).
"""
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass

import zmq
import zmq.auth

SERVER_KEY_ENV = "STEPSERVE_CURVE_SERVER_KEY"
SECRET_KEY_ENV = "STEPSERVE_CURVE_SECRET_KEY"
KEYS_DIR_ENV = "STEPSERVE_CURVE_KEYS"
ENV_VARS = (SERVER_KEY_ENV, SECRET_KEY_ENV, KEYS_DIR_ENV)
ROLES = ("scheduler", "client", "worker")
AUTHORIZED = "authorized"

HANDSHAKE_EVENTS = (zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
                    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_AUTH)


def generate_keys(directory: str) -> list[str]:
    """Writes the three key pairs and the authorized folder; returns the files written."""
    authorized = os.path.join(directory, AUTHORIZED)
    os.makedirs(authorized, exist_ok=True)
    written = []
    for role in ROLES:
        public, secret = zmq.auth.create_certificates(directory, role)
        os.chmod(secret, 0o600)
        written += [public, secret]
        if role != "scheduler":
            written.append(shutil.copy(public, authorized))
    return written


@dataclass(frozen=True)
class ConnectingKeys:
    """What a client or a worker needs: the scheduler's public key and a key pair of its own."""

    server_public: bytes
    public: bytes
    secret: bytes


def load_secret_certificate(path: str) -> tuple[bytes, bytes]:
    public, secret = zmq.auth.load_certificate(path)
    if not secret:
        raise ValueError(f"{path} holds no secret key: give the .key_secret file")
    return public, secret


def connecting_keys(role: str, server_key: str | None = None, secret_key: str | None = None,
                    environ: Mapping[str, str] = os.environ) -> ConnectingKeys | None:
    """The keys of a client (role "client") or a worker ("worker"); None: no CurveZMQ."""
    if not server_key and not secret_key:
        server_key, secret_key = environ.get(SERVER_KEY_ENV), environ.get(SECRET_KEY_ENV)
    if not server_key and not secret_key and environ.get(KEYS_DIR_ENV):
        folder = environ[KEYS_DIR_ENV]
        server_key, secret_key = os.path.join(folder, "scheduler.key"), os.path.join(folder, f"{role}.key_secret")
    if not server_key and not secret_key:
        return None
    if not server_key or not secret_key:
        raise ValueError("CurveZMQ needs both the scheduler's public key (curve_server_key) and this side's "
                         "secret key (curve_secret_key)")
    server_public, _ = zmq.auth.load_certificate(server_key)
    public, secret = load_secret_certificate(secret_key)
    return ConnectingKeys(server_public, public, secret)


def scheduler_keys(secret_key: str | None = None, authorized_keys: str | None = None,
                   environ: Mapping[str, str] = os.environ) -> tuple[tuple[bytes, bytes] | None, str | None]:
    """The scheduler's (public, secret) key pair and its folder of authorized public keys."""
    folder = environ.get(KEYS_DIR_ENV)
    if not secret_key and not authorized_keys and folder:
        secret_key, authorized_keys = os.path.join(folder, "scheduler.key_secret"), os.path.join(folder, AUTHORIZED)
    if authorized_keys and not secret_key:
        raise ValueError("--curve-authorized-keys needs --curve-secret-key (the scheduler's own secret certificate)")
    if authorized_keys and not os.path.isdir(authorized_keys):
        raise ValueError(f"--curve-authorized-keys {authorized_keys}: not a folder")
    return (load_secret_certificate(secret_key) if secret_key else None), authorized_keys or None


def secure_connecting_socket(sock: zmq.Socket, keys: ConnectingKeys | None) -> None:
    """Before connect(): the socket speaks CURVE to the scheduler, or NULL when keys is None."""
    if keys is not None:
        sock.curve_serverkey = keys.server_public
        sock.curve_publickey = keys.public
        sock.curve_secretkey = keys.secret


def secure_bound_socket(sock: zmq.Socket, key_pair: tuple[bytes, bytes] | None) -> None:
    """Before bind(): the socket is a CURVE server, or NULL when key_pair is None."""
    if key_pair is not None:
        sock.curve_server = True
        sock.curve_publickey, sock.curve_secretkey = key_pair


# A connection closed during the handshake (EVENT_HANDSHAKE_FAILED_NO_DETAIL) is all a CURVE
# client sees of a wrong server key (the scheduler cannot read its hello and hangs up), but also
# all it sees of a port forwarder with nothing behind it yet (docker's userland proxy while the
# scheduler's container starts): a refusal only once it has lasted this long with no handshake
# succeeding in between. Within the 5 s promised for a clear error; longer than a container's start.
CLOSED_IN_HANDSHAKE_GRACE_S = 3.0


class HandshakeRefusals:
    """Tells, from a connecting socket's monitor events, a scheduler that refuses this side from
    a connection that merely closed: AUTH (its ZAP handler said no) and PROTOCOL (CurveZMQ on one
    side only) at once; a closed handshake never without keys (NULL refuses nobody), and with keys
    only after CLOSED_IN_HANDSHAKE_GRACE_S of nothing else."""

    def __init__(self, uses_curve: bool):
        self.uses_curve = uses_curve
        self._closing_since: float | None = None  # the first closed handshake since the last success

    def on_event(self, event: int, now: float) -> str | None:
        """Why the scheduler refused this side, or None (not a refusal, or not yet)."""
        if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            self._closing_since = None
        elif event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
            return "the scheduler refused this side's CurveZMQ key (it is not among its authorized keys)"
        elif event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
            return ("the handshake with the scheduler failed: one side uses CurveZMQ keys and the other does not "
                    "(or a protocol mismatch)")
        elif event == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL and self.uses_curve:
            if self._closing_since is None:
                self._closing_since = now
            if now - self._closing_since >= CLOSED_IN_HANDSHAKE_GRACE_S:
                return ("the CurveZMQ handshake with the scheduler kept failing: is curve_server_key the "
                        "scheduler's public key?")
        return None
