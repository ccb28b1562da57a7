"""Scheduler configuration and the worker capacity it schedules against."""
from dataclasses import dataclass

from protocol.pooling import PoolingInfo

# The one list of each: the scheduler's flags and stepserve's cluster flags offer these.
PREEMPTION_MODES = ("recompute", "swap")
SCHEDULING_POLICIES = ("fcfs", "priority")
ROUTING_MODES = ("load", "prefix")  # scheduler_svc/routing.py
ROUTING_HELP = ("which replica takes a waiting request: prefix (default), the one whose prefix cache holds the "
                "most of its prompt unless it is much busier than the others; load, the first with room")


@dataclass(frozen=True)
class SchedulerConfig:
    """Budgets and policies of one scheduler core (one worker group)."""

    max_num_seqs: int = 256  # requests holding blocks (running) at once
    max_num_batched_tokens: int = 8192  # tokens computed in one step, prefill and decode together
    preemption_mode: str = "recompute"  # "recompute" or "swap"; Mamba state models always recompute
    policy: str = "fcfs"  # "fcfs" or "priority" (lower priority value first, may preempt; ties by arrival)
    enable_chunked_prefill: bool = True
    # Share the KV of full blocks whose tokens (and all before them) equal a cached block's.
    # Attention models only: the core turns it off where the worker holds Mamba state slots.
    enable_prefix_caching: bool = True
    # Plan step N+1 while the worker runs step N (two plans in flight); the service's choice,
    # the core allows it either way. On by default on every device: on a 2-vCPU CPU it measured
    # faster offline and served with lower latency (docs/figures.md, benchmarks/async_scheduling.py,
    # benchmarks/serve_peers.py).
    async_scheduling: bool = True
    # Which replica takes a waiting request: the first with room ("load"), or the one whose prefix
    # cache holds the most of its prompt within a load bound ("prefix"; scheduler_svc/routing.py).
    routing: str = "prefix"

    @property
    def plans_in_flight(self) -> int:
        """How many plans the service keeps in flight for a replica."""
        return 2 if self.async_scheduling else 1

    def __post_init__(self):
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}")
        if self.preemption_mode not in PREEMPTION_MODES:
            raise ValueError(f"preemption_mode must be one of {PREEMPTION_MODES}, got {self.preemption_mode!r}")
        if self.policy not in SCHEDULING_POLICIES:
            raise ValueError(f"policy must be one of {SCHEDULING_POLICIES}, got {self.policy!r}")
        if self.routing not in ROUTING_MODES:
            raise ValueError(f"routing must be one of {ROUTING_MODES}, got {self.routing!r}")


@dataclass(frozen=True)
class WorkerCapacity:
    """What a worker group can hold; built by the service from the workers' WorkerHello."""

    num_gpu_blocks: int
    block_size: int  # tokens per KV block: the worker's (its --block-size); block ids only mean something in it
    num_cpu_blocks: int = 0  # 0 disables swap (preemption falls back to recompute)
    num_state_slots: int = 0  # Mamba state slots; 0 for attention-only models
    max_model_len: int = 2048
    eos_token_ids: tuple[int, ...] = ()
    vocab_size: int | None = None  # prompt token ids must be below it; None: not checked
    pooling: PoolingInfo | None = None  # a pooling model: it serves pooling requests only; None: generative

    def __post_init__(self):
        if self.num_gpu_blocks < 1:
            raise ValueError(f"num_gpu_blocks must be >= 1, got {self.num_gpu_blocks}")
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")
        if self.num_cpu_blocks < 0 or self.num_state_slots < 0:
            raise ValueError("num_cpu_blocks and num_state_slots must be >= 0")
        if self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")
        object.__setattr__(self, "eos_token_ids", tuple(self.eos_token_ids))

    @classmethod
    def from_hello(cls, hello) -> "WorkerCapacity":
        """From a protocol.worker_messages.WorkerHello."""
        return cls(num_gpu_blocks=hello.num_gpu_blocks, block_size=hello.block_size,
                   num_cpu_blocks=hello.num_cpu_blocks, num_state_slots=hello.num_state_slots,
                   max_model_len=hello.max_model_len, eos_token_ids=tuple(hello.eos_token_ids),
                   vocab_size=hello.vocab_size, pooling=hello.pooling)
