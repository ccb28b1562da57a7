"""Wire types and framing shared by every stepserve process. Imports neither side."""
from protocol.errors import AuthenticationError, ErrorCode, ProtocolError
from protocol.sampling import SamplingParams
from protocol.version import PROTOCOL_VERSION

__all__ = ["AuthenticationError", "ErrorCode", "ProtocolError", "SamplingParams", "PROTOCOL_VERSION"]
