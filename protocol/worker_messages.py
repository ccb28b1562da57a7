"""Messages between the scheduler's worker socket (ROUTER) and each worker (DEALER).

The step plan is incremental: a worker keeps each request's token ids, block table and state
slot between steps, so a plan carries full data once (new_requests) and then only what changed.
"""
from typing import Annotated

import msgspec

from protocol.client_messages import TokenLogprobs
from protocol.limits import (MAX_BLOCKS, MAX_MODEL_LEN, MAX_NAME_LEN, MAX_STATE_SLOTS, MAX_TENSOR_PARALLEL_SIZE,
                             MAX_VOCAB_SIZE)
from protocol.pooling import PoolingInfo, PoolingParams
from protocol.sampling import SamplingDefaults, SamplingParams

BlockId = Annotated[int, msgspec.Meta(ge=0)]
Name = Annotated[str, msgspec.Meta(max_length=MAX_NAME_LEN)]
NumBlocks = Annotated[int, msgspec.Meta(ge=0, le=MAX_BLOCKS)]


class Message(msgspec.Struct, tag_field="type", forbid_unknown_fields=True):
    """Base of every worker-link message; the subclass name is the wire type tag."""


# ---- worker -> scheduler -------------------------------------------------------------

class WorkerHello(Message, tag=True):
    """Also sent again, by a live worker, to a scheduler that answers its heartbeat with
    HeartbeatReply(known=False): a restarted scheduler, or one that dropped it."""

    worker_id: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_NAME_LEN)]  # unique per worker process
    model: Name
    device: Name
    dtype: Name
    vocab_size: Annotated[int, msgspec.Meta(ge=1, le=MAX_VOCAB_SIZE)]
    max_model_len: Annotated[int, msgspec.Meta(ge=1, le=MAX_MODEL_LEN)]
    block_size: Annotated[int, msgspec.Meta(ge=1, le=1 << 16)]
    num_gpu_blocks: NumBlocks  # KV blocks on the device
    num_cpu_blocks: NumBlocks  # KV blocks in host memory for swap; 0 disables swap
    num_state_slots: Annotated[int, msgspec.Meta(ge=0, le=MAX_STATE_SLOTS)]  # Mamba state slots; 0 without
    eos_token_ids: Annotated[list[int], msgspec.Meta(max_length=1024)]
    tokenizer_json: str | None
    tensor_parallel_size: Annotated[int, msgspec.Meta(ge=1, le=MAX_TENSOR_PARALLEL_SIZE)] = 1
    rank: Annotated[int, msgspec.Meta(ge=0, lt=MAX_TENSOR_PARALLEL_SIZE)] = 0
    # The ranks of one tensor-parallel group share a group id and form one replica: the same
    # plan goes to every rank, rank 0 answers. Empty for a worker alone (its worker_id is used).
    group_id: Name = ""
    # From the model folder (tokenizer_config.json's chat_template, or chat_template.jinja), and
    # the special tokens' text (bos_token, eos_token, ...) that templates refer to. Relayed to
    # clients in ModelInfo like tokenizer_json, so a gateway on another host renders chats.
    chat_template: str | None = None
    special_tokens: dict[str, str] = {}
    compiled: bool = False  # the model's step runs compiled (torch.compile), not op by op
    # generation_config.json's sampling defaults, relayed to clients in ModelInfo
    sampling_defaults: SamplingDefaults = SamplingDefaults()
    pooling: PoolingInfo | None = None  # a pooling model (an embedder, a classifier); None: generative


class StepResult(Message, tag=True):
    """Sampled tokens of one plan, aligned with plan.new_requests + plan.running_requests.

    -1 marks a request that ran a prefill chunk which did not reach the end of its tokens.
    """

    step_id: int
    sampled_token_ids: list[int]
    logprobs: list[TokenLogprobs | None] | None = None  # aligned likewise, when any asked
    error: str | None = None  # the whole step failed; the scheduler fails its requests
    # Requests that failed alone (index in the plan's order -> why; their token is -1): a bad
    # request parameter only the worker can judge (a grammar that does not compile).
    request_errors: dict[int, str] = {}
    # SamplingParams.prompt_logprobs of the prompt tokens this step's chunk scored: index in the
    # plan's order -> (index in the prompt of the first token scored, one entry per token).
    prompt_logprobs: dict[int, tuple[int, list[TokenLogprobs]]] = {}
    busy_s: float = 0.0  # the worker's time executing the plan (inputs, forward, sampling)
    # Pooling requests' results: index in the plan's order -> float32 little-endian values
    # (their sampled_token_ids entry is -1).
    pooled: dict[int, bytes] = {}


class Heartbeat(Message, tag=True):
    worker_id: Name
    num_kv_blocks_in_use: int
    num_state_slots_in_use: int
    num_requests: int


# ---- scheduler -> worker -------------------------------------------------------------

class NewRequestData(msgspec.Struct, array_like=True, gc=False, forbid_unknown_fields=True):
    """A request the worker has no state for: its first scheduling, or after preemption.

    token_ids holds the prompt and any tokens generated before a recompute preemption; the
    worker computes token_ids[num_computed_tokens : num_computed_tokens + num_new_tokens].
    The KV of the first num_computed_tokens tokens already lies in block_ids: after a swap-in,
    or where the scheduler found a prefix in its cache (those blocks may be shared with other
    requests; the worker only reads them, it writes past num_computed_tokens).
    """

    request_id: str
    token_ids: list[int]
    num_prompt_tokens: int
    params: SamplingParams
    block_ids: list[BlockId]
    num_computed_tokens: int
    num_new_tokens: int
    pooling: PoolingParams | None = None  # a pooling request: its whole prompt runs in this step


class RunningRequestData(msgspec.Struct, array_like=True, gc=False, forbid_unknown_fields=True):
    """A request the worker already holds: only blocks appended since its last step."""

    request_id: str
    new_block_ids: list[BlockId]
    num_new_tokens: int


class StepPlan(Message, tag=True):
    step_id: int
    # Freed by the worker (blocks forgotten, state slot released) before it runs this step.
    # Every request that finished or was aborted since the previous plan, whatever queue it
    # was in; never lagged, never missing one. Unknown ids are ignored.
    finished_ids: list[str]
    # Preempted in this step, by recompute or by swap (a swapped request's KV leaves in
    # blocks_to_swap_out): the worker drops their state; each comes back in new_requests (or
    # in finished_ids, if it ends first).
    preempted_ids: list[str]
    new_requests: list[NewRequestData]
    running_requests: list[RunningRequestData]
    # (src, dst) pairs: device block -> cpu block, cpu block -> device block, device -> device.
    # Applied in this order, after the frees and before the forward. A copy is copy-on-write:
    # a request whose every token was cached gets its own copy of the shared last block.
    blocks_to_swap_out: list[tuple[int, int]] = []
    blocks_to_swap_in: list[tuple[int, int]] = []
    blocks_to_copy: list[tuple[int, int]] = []

    @property
    def num_scheduled(self) -> int:
        return len(self.new_requests) + len(self.running_requests)


class Shutdown(Message, tag=True):
    reason: str = ""


class HeartbeatReply(Message, tag=True):
    """The answer to every heartbeat, on the heartbeat's own socket. A worker whose heartbeats
    go unanswered knows the scheduler is gone; known=False means this scheduler (a restarted
    one: a new instance_id, or one that dropped the worker for silence) holds no replica for the
    worker, which then forgets its requests and says hello again on a new connection."""

    instance_id: str
    known: bool


WorkerToScheduler = WorkerHello | StepResult | Heartbeat
SchedulerToWorker = StepPlan | Shutdown | HeartbeatReply
