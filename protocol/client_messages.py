"""Messages between the SDK (DEALER) and the scheduler's frontend (ROUTER).

A client may submit any number of requests in one `Generate`; the scheduler answers with
`RequestOutputs` batches (one per step per client), so per-message costs stay per batch.
"""
from collections.abc import Sequence
from typing import Annotated, Literal

import msgspec

from protocol.limits import MAX_PROMPT_TOKENS, MAX_REQUEST_ID_LEN, MAX_REQUESTS_PER_MESSAGE
from protocol.pooling import PoolingInfo, PoolingParams, pooling_refusal
from protocol.sampling import SamplingDefaults, SamplingParams, TokenId

RequestId = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_REQUEST_ID_LEN)]
FinishReason = Literal["length", "stop", "abort", "error"]


class Message(msgspec.Struct, tag_field="type", forbid_unknown_fields=True):
    """Base of every client-link message; the subclass name is the wire type tag."""


# ---- client -> scheduler -------------------------------------------------------------

BATCH_PRIORITY = 1  # run-batch's default and the Batch API's floor: served after interactive requests


class GenerateRequest(msgspec.Struct, array_like=True, gc=False, forbid_unknown_fields=True):
    request_id: RequestId
    prompt_token_ids: Annotated[list[TokenId], msgspec.Meta(min_length=1, max_length=MAX_PROMPT_TOKENS)]
    params: SamplingParams
    # vLLM's convention: lower runs first when the scheduler's priority policy is on (and may
    # preempt a running request of a higher value); ties in arrival order. Interactive
    # requests have 0, batch jobs BATCH_PRIORITY.
    priority: int = 0
    # Stream: an output every step. Otherwise one output, when the request finishes.
    stream: bool = False
    # Set: a pooling request (protocol/pooling.py); params are ignored (send max_tokens=1).
    pooling: PoolingParams | None = None

    def __post_init__(self):
        refusal = pooling_refusal(self.pooling, len(self.prompt_token_ids)) if self.pooling is not None else None
        if refusal is not None:
            raise ValueError(refusal)


def request_refusal(request_id: str, prompt_token_ids: Sequence[int], pooling: PoolingParams | None = None
                    ) -> str | None:
    """Why decoding would refuse a GenerateRequest with this id, prompt and pooling params, or
    None. The sampling params are checked by their own type; the SDK asks this before sending, so
    that its caller hears at once what the scheduler would answer."""
    if not 1 <= len(request_id) <= MAX_REQUEST_ID_LEN:
        return f"a request id has 1 to {MAX_REQUEST_ID_LEN} characters, this one {len(request_id)}"
    if not 1 <= len(prompt_token_ids) <= MAX_PROMPT_TOKENS:
        return f"a prompt has 1 to {MAX_PROMPT_TOKENS} tokens, this one {len(prompt_token_ids)}"
    if min(prompt_token_ids) < 0:
        return "prompt token ids must be >= 0"
    return pooling_refusal(pooling, len(prompt_token_ids)) if pooling is not None else None


class Generate(Message, tag=True):
    requests: Annotated[list[GenerateRequest], msgspec.Meta(max_length=MAX_REQUESTS_PER_MESSAGE)]


class Abort(Message, tag=True):
    request_ids: Annotated[list[RequestId], msgspec.Meta(max_length=MAX_REQUESTS_PER_MESSAGE)]


class ModelInfoQuery(Message, tag=True):
    pass


class HealthQuery(Message, tag=True):
    pass


# ---- scheduler -> client -------------------------------------------------------------

class TokenLogprobs(msgspec.Struct, array_like=True, gc=False):
    """One step's logprobs: the sampled token's and the top-N alternatives'."""

    token_id: int
    logprob: float
    top_token_ids: list[int] = []
    top_logprobs: list[float] = []


class RequestOutput(msgspec.Struct, array_like=True, gc=False):
    """New tokens of one request since its last output; finish_reason set on its last one."""

    request_id: str
    new_token_ids: list[int]
    num_prompt_tokens: int
    finish_reason: FinishReason | None = None
    logprobs: list[TokenLogprobs] | None = None
    error_code: str | None = None
    error_message: str | None = None
    # SamplingParams.prompt_logprobs: prompt tokens 1..n-1 (the first has none), once, on the
    # request's first output that carries a token (its only output unless it streams).
    prompt_logprobs: list[TokenLogprobs] | None = None
    # A pooling request's result, on its one output: float32 little-endian values
    # (np.frombuffer(pooled, "<f4")): the embedding, or the classifier's per-label values.
    pooled: bytes | None = None


class RequestOutputs(Message, tag=True):
    outputs: list[RequestOutput]


class ErrorReply(Message, tag=True):
    """A frame-level error: the frame did not decode or was not meant for this link."""

    code: str
    message: str


class ModelInfo(Message, tag=True):
    model: str | None  # None until a worker has said hello
    vocab_size: int = 0
    max_model_len: int = 0
    eos_token_ids: list[int] = []
    tokenizer_json: str | None = None  # Hugging Face tokenizers JSON, relayed from the worker
    num_replicas: int = 0  # data-parallel replicas joined (each one worker or a tensor-parallel group)
    chat_template: str | None = None  # Jinja, relayed from the worker; None: the model has none
    special_tokens: dict[str, str] = {}  # bos_token, eos_token, ...: the names templates use
    # Requests the scheduler holds at most (--max-queued-requests): the SDK's default batch window.
    max_queued_requests: int = 0
    instance_id: str = ""  # new on every scheduler start: a client can tell a restart
    # What the workers run, from their hello: for the line a local cluster prints when it is up.
    dtype: str = ""
    device: str = ""
    compiled: bool = False
    # The model's sampling defaults (generation_config.json) for fields a request leaves unset
    sampling_defaults: SamplingDefaults = SamplingDefaults()
    pooling: PoolingInfo | None = None  # a pooling model's facts; None: a generative model


class ReplicaHealth(msgspec.Struct, array_like=True):
    """One replica (a worker, or a tensor-parallel group) as the scheduler sees it."""

    name: str
    num_ranks: int
    num_steps: int
    num_waiting: int
    num_running: int
    num_swapped: int
    num_free_blocks: int
    num_total_blocks: int
    # Over its recent steps: mean time between step results, and the fraction of wall time
    # its worker spent executing steps (async scheduling raises it by hiding planning).
    mean_step_time_ms: float = 0.0
    worker_busy_fraction: float = 0.0
    # Its prefix cache, in tokens (prompt tokens looked up on admission, and those found), and
    # the requests prefix routing sent it because it cached more of their prompt.
    num_prefix_cache_queries: int = 0
    num_prefix_cache_hits: int = 0
    num_routed_by_prefix: int = 0


class Health(Message, tag=True):
    num_waiting: int
    num_running: int
    num_swapped: int
    num_workers: int  # worker processes joined, every rank of every replica
    num_free_blocks: int
    num_total_blocks: int
    num_free_state_slots: int
    num_total_state_slots: int
    steps_per_s: float
    num_steps: int
    num_finished: int
    # Worker-reported usage, summed over workers (from their last heartbeat or result).
    worker_kv_blocks_in_use: int = 0
    worker_state_slots_in_use: int = 0
    replicas: list[ReplicaHealth] = []
    num_preemptions: int = 0
    # Prefix caching, summed over replicas: device blocks known by their hash (in use or
    # evictable), and tokens looked up on admission (queries) and found computed (hits).
    num_cached_blocks: int = 0
    num_prefix_cache_queries: int = 0
    num_prefix_cache_hits: int = 0
    instance_id: str = ""  # new on every scheduler start
    draining: bool = False  # stopping: takes no new requests, finishes those it holds
    # Replicas dropped because their workers fell silent past --worker-timeout, still connected:
    # not serving until they say hello again (the healthy ones are `replicas`).
    unhealthy_replicas: list[str] = []


ClientToScheduler = Generate | Abort | ModelInfoQuery | HealthQuery
SchedulerToClient = RequestOutputs | ErrorReply | ModelInfo | Health
