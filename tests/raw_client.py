"""RawClient: a bare DEALER speaking the client protocol (a test tool): sends frames, collects
outputs, for tests that must send what the SDK never would."""
import asyncio

import zmq
import zmq.asyncio

from protocol.client_messages import ErrorReply, RequestOutputs
from protocol.codec import scheduler_to_client_decoder


class RawClient:
    """A bare DEALER speaking the client protocol (a test tool): sends frames, collects outputs."""

    def __init__(self, address: str):
        self.ctx = zmq.asyncio.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.connect(address)
        self.decoder = scheduler_to_client_decoder()
        self.outputs: dict[str, list] = {}

    async def send(self, frame: bytes) -> None:
        await self.sock.send(frame)

    async def receive_until(self, done, timeout_s: float = 30):
        """Reads replies until done(self) holds; returns the ErrorReplies seen."""
        errors = []
        while not done(self):
            reply = self.decoder.decode(await asyncio.wait_for(self.sock.recv(), timeout_s))
            if isinstance(reply, ErrorReply):
                errors.append(reply)
            elif isinstance(reply, RequestOutputs):
                for output in reply.outputs:
                    self.outputs.setdefault(output.request_id, []).append(output)
        return errors

    def close(self) -> None:
        self.sock.close(0)
        self.ctx.term()
