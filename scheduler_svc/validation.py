"""What a request must pass before a replica's core takes it: checks against that replica's
worker (its vocabulary, its memory and length limit). The core runs them in add_request, so a
request refused here fails alone, and a request that waits for a worker is checked once one
is there. Limits that need no worker (lengths of ids, parameters) are the protocol's
(protocol/limits.py), checked when the message is decoded."""
from protocol.errors import ErrorCode
from scheduler_svc.config import WorkerCapacity
from scheduler_svc.errors import RequestRejected
from scheduler_svc.request import Request


def check_request(request: Request, capacity: WorkerCapacity, max_len: int) -> None:
    """Raises RequestRejected unless the request fits the worker. max_len: the longest a
    request may grow on it (Scheduler.max_len)."""
    if request.num_tokens >= max_len:
        raise RequestRejected(
            ErrorCode.PROMPT_TOO_LONG,
            f"{request.num_tokens} tokens leave no room to generate: the limit is {max_len} "
            f"(max_model_len {capacity.max_model_len}, "
            f"{capacity.num_gpu_blocks} blocks of {capacity.block_size} tokens)")
    if capacity.vocab_size is None:
        return
    if max(request.prompt_token_ids) >= capacity.vocab_size:
        raise RequestRejected(ErrorCode.INVALID_PARAMS,
                              f"prompt token id out of range (vocab size {capacity.vocab_size})")
    params = request.params
    for name, ids in (("logit_bias", params.logit_bias), ("allowed_token_ids", params.allowed_token_ids)):
        if ids and max(ids) >= capacity.vocab_size:
            raise RequestRejected(ErrorCode.INVALID_PARAMS,
                                  f"{name} names token id {max(ids)}, out of range (vocab size {capacity.vocab_size})")
