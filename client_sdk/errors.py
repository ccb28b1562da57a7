"""The SDK's exceptions, and which one a failed request raises."""
from protocol import ErrorCode
from protocol.errors import AuthenticationError as _WireAuthenticationError


class ServiceError(Exception):
    """The scheduler refused a frame (ErrorReply) or could not be reached in time."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class RequestError(Exception):
    """One request failed on the server: bad parameters, prompt too long, worker error."""

    def __init__(self, request_id: str, code: str, message: str):
        super().__init__(f"request {request_id}: {code}: {message}")
        self.request_id = request_id
        self.code = code
        self.message = message


class ChatTemplateError(ValueError):
    """A conversation could not be rendered: the model has no chat template, or it failed."""


class PromptTooLong(ValueError):
    """A prompt's text is longer than the model's context could hold, whatever its tokens: refused
    before it is tokenized."""

    code = ErrorCode.PROMPT_TOO_LONG


class AuthenticationError(ServiceError, _WireAuthenticationError):
    """The scheduler refused this client's CurveZMQ handshake: its key is not authorized, the
    server key is wrong, or only one side uses keys. Raised within moments, never a silent hang."""


# Codes that say the service, not the request, failed: the request was lost, not refused.
_SERVICE_CODES = (ErrorCode.SCHEDULER_RESTARTED, ErrorCode.TIMEOUT)


def request_failure(request_id: str, code: str, message: str) -> Exception:
    """The exception for a request that ended with this error code."""
    if code == ErrorCode.AUTHENTICATION_FAILED:
        return AuthenticationError(code, message)
    if code in _SERVICE_CODES:
        return ServiceError(code, f"request {request_id}: {message}")
    return RequestError(request_id, code, message)
