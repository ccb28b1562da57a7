"""Framing: one version byte, then the msgpack of a tagged message.

Decoders are per direction of a link, so a message sent on the wrong link is a decode error.
Every failure (short frame, wrong version, bad msgpack, wrong type, value out of range)
raises ProtocolError and nothing else.
"""
import msgspec

from protocol.client_messages import ClientToScheduler, SchedulerToClient
from protocol.errors import ProtocolError
from protocol.version import PROTOCOL_VERSION
from protocol.worker_messages import SchedulerToWorker, WorkerToScheduler

_VERSION_BYTE = bytes([PROTOCOL_VERSION])
_encoder = msgspec.msgpack.Encoder()


def encode(message: msgspec.Struct) -> bytes:
    return _VERSION_BYTE + _encoder.encode(message)


class Decoder:
    """Decodes frames of one link direction into its message union."""

    def __init__(self, message_type):
        self._decoder = msgspec.msgpack.Decoder(message_type)

    def decode(self, frame: bytes | memoryview):
        view = memoryview(frame)
        if len(view) < 2:
            raise ProtocolError(f"frame of {len(view)} bytes is too short")
        if view[0] != PROTOCOL_VERSION:
            raise ProtocolError(
                f"protocol version {view[0]} is not supported (this side speaks {PROTOCOL_VERSION})")
        try:
            return self._decoder.decode(view[1:])
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            raise ProtocolError(str(e)) from None
        except (ValueError, TypeError, RecursionError, OverflowError) as e:
            raise ProtocolError(f"invalid message: {e}") from None


def client_to_scheduler_decoder() -> Decoder:
    return Decoder(ClientToScheduler)


def scheduler_to_client_decoder() -> Decoder:
    return Decoder(SchedulerToClient)


def worker_to_scheduler_decoder() -> Decoder:
    return Decoder(WorkerToScheduler)


def scheduler_to_worker_decoder() -> Decoder:
    return Decoder(SchedulerToWorker)
