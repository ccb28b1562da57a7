"""Errors the scheduler core raises to the service."""


class RequestRejected(Exception):
    """A request that cannot be accepted; the service answers the client with `code`.

    code is a protocol.ErrorCode value (DUPLICATE_ID, PROMPT_TOO_LONG, ...).
    """

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message
