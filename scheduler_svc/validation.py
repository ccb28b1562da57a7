"""Checks a request must pass before a replica's core takes it: those that need the worker's
hello (the core itself checks what depends on its capacity: length, duplicate ids)."""
from protocol.errors import ErrorCode
from scheduler_svc.errors import RequestRejected
from scheduler_svc.request import Request


def check_token_ids(request: Request, vocab_size: int) -> None:
    """Every prompt token id names a row of the model's embedding."""
    if max(request.prompt_token_ids) >= vocab_size:
        raise RequestRejected(ErrorCode.INVALID_PARAMS, f"prompt token id out of range (vocab size {vocab_size})")
