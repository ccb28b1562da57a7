"""Admission: which requests of a Generate the scheduler takes, and why it refuses the others.

Backpressure is a bound on the requests the scheduler holds (waiting or running): past it, each
request that does not fit gets an immediate `overloaded` error of its own, so memory stays
bounded whatever clients send, and a client that windows its batch (the SDK's generate_batch)
never meets the bound. The SDK does not retry a refused request on its own.
"""
from protocol import ErrorCode
from protocol.client_messages import GenerateRequest

# About 600 bytes per waiting request of a short prompt (the Request, its token list, its entry in
# the book): 200k of them stay near 150 MB, well under 1 GB with room for longer prompts.
DEFAULT_MAX_QUEUED_REQUESTS = 200_000


class Admission:
    def __init__(self, max_queued_requests: int = DEFAULT_MAX_QUEUED_REQUESTS):
        if max_queued_requests < 1:
            raise ValueError(f"max_queued_requests must be >= 1, got {max_queued_requests}")
        self.max_queued_requests = max_queued_requests
        self.draining = False  # set by the drain: nothing new is taken

    def refusal(self, g: GenerateRequest, num_live: int, is_live) -> tuple[str, str] | None:
        """(error code, message) when the request is refused; None when it is taken.

        num_live: requests the scheduler holds now; is_live(request_id): is that id live."""
        if self.draining:
            return ErrorCode.SHUTTING_DOWN, "the scheduler is shutting down and takes no new requests"
        if is_live(g.request_id):
            return ErrorCode.DUPLICATE_ID, f"request id {g.request_id!r} is already running"
        if g.params.n != 1 or g.params.stop:  # the SDK's: it sends each choice as a request, n = 1
            return ErrorCode.INVALID_PARAMS, "n > 1 and stop strings are handled by the SDK; send n = 1 and no stop strings"
        if num_live >= self.max_queued_requests:
            return ErrorCode.OVERLOADED, (f"the scheduler holds {num_live} requests, its limit "
                                          "(--max-queued-requests): retry later, or bound the requests in flight "
                                          "(generate_batch's window)")
        return None
