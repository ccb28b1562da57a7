"""The protocol's own error type and the error codes that travel in error replies."""


class ProtocolError(Exception):
    """A frame could not be decoded or validated: bad bytes, wrong version, wrong fields."""


class ErrorCode:
    """Values of `ErrorReply.code` and `RequestOutput.error_code`; strings so that logs read."""

    BAD_FRAME = "bad_frame"  # could not decode, wrong version, wrong type for this link
    INVALID_PARAMS = "invalid_params"  # the request decoded but its values are out of range
    PROMPT_TOO_LONG = "prompt_too_long"  # prompt (+ max_tokens) exceeds what the model can hold
    DUPLICATE_ID = "duplicate_id"  # a live request already has this id
    UNKNOWN_REQUEST = "unknown_request"
    WORKER_ERROR = "worker_error"  # the worker failed while running this request
    INTERNAL = "internal"
