"""Framing: one version byte, then the msgpack of a tagged message.

Decoders are per direction of a link, so a message sent on the wrong link is a decode error.
Every failure (short frame, wrong version, bad msgpack, wrong type, value out of range)
raises ProtocolError and nothing else.
"""
import msgspec

from protocol.client_messages import ClientToScheduler, GenerateRequest, SchedulerToClient
from protocol.errors import ProtocolError
from protocol.limits import MAX_REQUESTS_PER_MESSAGE
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


class _LooseGenerate(msgspec.Struct, tag="Generate", tag_field="type"):
    requests: list[msgspec.Raw]


class _LooseId(msgspec.Struct, array_like=True):
    request_id: str


_loose_generate = msgspec.msgpack.Decoder(_LooseGenerate)
_strict_request = msgspec.msgpack.Decoder(GenerateRequest)
_loose_id = msgspec.msgpack.Decoder(_LooseId)


def salvage_generate(frame: bytes | memoryview):
    """For a Generate frame that failed to decode as a whole: the requests in it that are
    valid, and (request_id, error) for each invalid one whose id can be read (a string of any
    length: the answer costs what the question did), so one bad request fails alone. None when
    the frame is not a readable Generate at all. A message with more than
    MAX_REQUESTS_PER_MESSAGE requests is refused whole: each readable id gets the error."""
    view = memoryview(frame)
    if len(view) < 2 or view[0] != PROTOCOL_VERSION:
        return None
    try:
        loose = _loose_generate.decode(view[1:])
    except (msgspec.DecodeError, msgspec.ValidationError, ValueError, TypeError):
        return None
    too_many = len(loose.requests) > MAX_REQUESTS_PER_MESSAGE
    valid, invalid = [], []
    for raw in loose.requests:
        try:
            if too_many:
                raise ValueError(f"{len(loose.requests)} requests in one message: at most "
                                 f"{MAX_REQUESTS_PER_MESSAGE} (send several messages)")
            valid.append(_strict_request.decode(raw))
        except (msgspec.DecodeError, msgspec.ValidationError, ValueError, TypeError) as e:
            try:
                request_id = _loose_id.decode(raw).request_id
            except (msgspec.DecodeError, msgspec.ValidationError, ValueError, TypeError):
                continue
            # Answered whatever its id, one past the limit too: its sender waits for that id.
            invalid.append((request_id, str(e)))
    return valid, invalid
