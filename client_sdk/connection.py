"""What the client's socket monitor says about its connection to the scheduler.

A ZeroMQ DEALER reconnects by itself and never tells its user; the monitor does, and each event
decides the fate of the requests live on the client:
- a refused handshake (a key the scheduler does not accept, CurveZMQ on one side only, a wrong
  server key: protocol.curve.HandshakeRefusals tells them from a connection that merely closed
  during the handshake): AuthenticationError, for every live request and query, and at once for new calls
  until a handshake succeeds;
- an established connection that closes: the scheduler stopped or restarted, or the network
  broke it; either way the scheduler forgot this connection's requests (it routes outputs by the
  connection), so each live one fails with `scheduler_restarted` instead of waiting forever.
"""
import time

import zmq

from client_sdk.errors import AuthenticationError
from protocol import ErrorCode
from protocol.curve import HANDSHAKE_EVENTS, HandshakeRefusals

MONITORED_EVENTS = zmq.EVENT_DISCONNECTED | HANDSHAKE_EVENTS


class ConnectionState:
    def __init__(self, address: str, uses_curve: bool):
        self.address = address
        self.connected = False
        self.auth_error: AuthenticationError | None = None
        self._refusals = HandshakeRefusals(uses_curve)

    def on_event(self, event: int) -> tuple[str, str] | None:
        """(error code, message) for every live request when the event loses them, else None."""
        failure = self._refusals.on_event(event, time.monotonic())
        if failure is not None:
            self.connected = False
            message = f"{failure} (scheduler at {self.address})"
            self.auth_error = AuthenticationError(ErrorCode.AUTHENTICATION_FAILED, message)
            return ErrorCode.AUTHENTICATION_FAILED, message
        if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            self.connected, self.auth_error = True, None
        elif event == zmq.EVENT_DISCONNECTED and self.connected:
            self.connected = False
            return ErrorCode.SCHEDULER_RESTARTED, (f"the connection to the scheduler at {self.address} closed (it "
                                                   "stopped or restarted): this request was lost; send it again")
        return None
