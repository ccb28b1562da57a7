"""The protocol's own error type and the error codes that travel in error replies."""


class ProtocolError(Exception):
    """A frame could not be decoded or validated: bad bytes, wrong version, wrong fields."""


class AuthenticationError(Exception):
    """The peer refused this side's CurveZMQ keys (or this side's keys do not fit the peer's
    mechanism): an unauthorized client or worker, a wrong server key, keys on one side only."""


class ErrorCode:
    """Values of `ErrorReply.code` and `RequestOutput.error_code`; strings so that logs read."""

    BAD_FRAME = "bad_frame"  # could not decode, wrong version, wrong type for this link
    INVALID_PARAMS = "invalid_params"  # the request decoded but its values are out of range
    PROMPT_TOO_LONG = "prompt_too_long"  # prompt (+ max_tokens) exceeds what the model can hold
    DUPLICATE_ID = "duplicate_id"  # a live request already has this id
    WORKER_ERROR = "worker_error"  # the worker failed while running this request
    INTERNAL = "internal"
    OVERLOADED = "overloaded"  # --max-queued-requests reached: retry later, or send fewer at once
    SHUTTING_DOWN = "shutting_down"  # the scheduler is draining: refused, or not finished in time
    # Set by the SDK, not the scheduler: the request was live on a scheduler that went away (the
    # connection broke: it stopped or restarted), or it did not finish within request_timeout_s.
    SCHEDULER_RESTARTED = "scheduler_restarted"
    TIMEOUT = "timeout"
    AUTHENTICATION_FAILED = "authentication_failed"
