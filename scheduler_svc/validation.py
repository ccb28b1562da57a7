"""What a request must pass before a replica's core takes it: checks against that replica's
worker (its kind: generative or pooling, its vocabulary, its memory and length limit). The core runs them in add_request, so a
request refused here fails alone, and a request that waits for a worker is checked once one
is there. Limits that need no worker (lengths of ids, parameters) are the protocol's
(protocol/limits.py), checked when the message is decoded."""
from protocol.errors import ErrorCode
from scheduler_svc.config import WorkerCapacity
from scheduler_svc.errors import RequestRejected
from scheduler_svc.request import Request


def check_request(request: Request, capacity: WorkerCapacity, max_len: int, step_token_budget: int) -> None:
    """Raises RequestRejected unless the request fits the worker. max_len: the longest a
    request may grow on it (Scheduler.max_len); step_token_budget: the tokens one step computes
    (max_num_batched_tokens), which bounds a pooling request's prompt."""
    check_kind(request, capacity)
    if request.pooling is not None:
        # Never chunked: a bidirectional model needs the whole prompt at once, and a pooled
        # vector is of the whole prompt.
        limit = min(capacity.max_model_len, capacity.num_gpu_blocks * capacity.block_size, step_token_budget)
        if request.num_tokens > limit:
            raise RequestRejected(
                ErrorCode.PROMPT_TOO_LONG,
                f"{request.num_tokens} tokens are more than a pooling request may have: its whole prompt runs in "
                f"one step, so the limit is {limit} (max_model_len {capacity.max_model_len}, the step's token "
                f"budget max_num_batched_tokens {step_token_budget}, "
                f"{capacity.num_gpu_blocks} blocks of {capacity.block_size} tokens)")
    elif request.num_tokens >= max_len:
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
    if request.pooling is not None:
        return  # its sampling params are ignored
    params = request.params
    for name, ids in (("logit_bias", params.logit_bias), ("allowed_token_ids", params.allowed_token_ids)):
        if ids and max(ids) >= capacity.vocab_size:
            raise RequestRejected(ErrorCode.INVALID_PARAMS,
                                  f"{name} names token id {max(ids)}, out of range (vocab size {capacity.vocab_size})")


def check_kind(request: Request, capacity: WorkerCapacity) -> None:
    """A pooling request needs a pooling model of its task, a generative request a generative model."""
    model = capacity.pooling
    if request.pooling is None:
        if model is not None:
            raise RequestRejected(ErrorCode.INVALID_PARAMS,
                                  f"this model is a pooling model (task {model.task!r}): it answers {model.task} "
                                  f"requests, not text generation")
    elif model is None:
        raise RequestRejected(ErrorCode.INVALID_PARAMS,
                              f"this model generates text: it answers no {request.pooling.task} (pooling) requests; "
                              f"serve a pooling model (--task embed or classify)")
    elif request.pooling.task != model.task:
        raise RequestRejected(ErrorCode.INVALID_PARAMS,
                              f"this model's pooling task is {model.task!r}: it answers no {request.pooling.task!r} "
                              f"requests")
