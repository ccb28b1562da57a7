"""Replica: one worker (or one tensor-parallel group of workers) and the scheduler core that
plans its steps. Each replica has its own block pool and running batch (data parallel)."""
import asyncio
import dataclasses
import logging
import time

from protocol.worker_messages import Heartbeat, StepPlan, StepResult, WorkerHello
from scheduler_svc.config import SchedulerConfig, WorkerCapacity
from scheduler_svc.scheduler import Scheduler

logger = logging.getLogger("stepserve.scheduler")


class WorkerLost(Exception):
    """The replica's worker died or went silent; its in-flight step will never answer."""


class Replica:
    def __init__(self, name: str, hello: WorkerHello, config: SchedulerConfig, arrivals=None):
        """arrivals: the service's arrival counter, shared by every core (see Scheduler)."""
        self.name = name  # the group's key: worker_id, or the TP group id
        self.hello = hello
        self.identities: dict[int, bytes] = {}  # rank -> ROUTER identity
        self.worker_ids: dict[int, str] = {}  # rank -> worker_id
        capacity = WorkerCapacity(
            num_gpu_blocks=hello.num_gpu_blocks,
            num_cpu_blocks=hello.num_cpu_blocks if config.preemption_mode == "swap" else 0,
            num_state_slots=hello.num_state_slots,
            max_model_len=hello.max_model_len,
            eos_token_ids=tuple(hello.eos_token_ids),
        )
        if hello.block_size != config.block_size:
            # Block ids only mean something in the worker's own block size: adopt it.
            config = dataclasses.replace(config, block_size=hello.block_size)
        self.core = Scheduler(config, capacity, arrivals)
        if config.enable_prefix_caching and not self.core.enable_prefix_caching:
            logger.info("replica %s: prefix caching off: %s keeps per-request state (%d state slots) "
                        "that a cached prefix cannot restore", name, hello.model, hello.num_state_slots)
        self.alive = True
        self.last_seen: dict[str, float] = {}  # worker_id -> when it last said anything
        self.wakeup = asyncio.Event()
        self.inflight: StepPlan | None = None
        self._result: asyncio.Future | None = None
        self.last_heartbeat: dict[str, Heartbeat] = {}  # by worker_id
        self.num_steps = 0

    @property
    def tensor_parallel_size(self) -> int:
        return self.hello.tensor_parallel_size

    @property
    def is_complete(self) -> bool:
        """Every rank of the group has said hello."""
        return len(self.identities) == self.tensor_parallel_size

    def add_rank(self, rank: int, identity: bytes, worker_id: str) -> None:
        self.identities[rank] = identity
        self.worker_ids[rank] = worker_id
        self.last_seen[worker_id] = time.monotonic()

    def seen(self, worker_id: str) -> None:
        if worker_id in self.last_seen:
            self.last_seen[worker_id] = time.monotonic()

    def silent_for(self, now: float) -> float:
        """How long the quietest rank has been silent: one dead rank stalls the whole group."""
        return now - min(self.last_seen.values())

    def begin_step(self, plan: StepPlan) -> asyncio.Future:
        assert self.inflight is None, "one step in flight per replica"
        self.inflight = plan
        self._result = asyncio.get_running_loop().create_future()
        return self._result

    def deliver(self, result: StepResult) -> bool:
        """Hands the worker's answer to the waiting step; False if it answers no live step."""
        self.seen(self.worker_ids[0])
        if self.inflight is None or result.step_id != self.inflight.step_id:
            return False
        self.inflight = None
        if not self._result.done():
            self._result.set_result(result)
        return True

    def fail(self) -> None:
        self.alive = False
        self.wakeup.set()
        if self._result is not None and not self._result.done():
            self._result.set_exception(WorkerLost(self.name))
        self.inflight = None
