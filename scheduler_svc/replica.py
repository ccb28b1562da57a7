"""Replica: one worker (or one tensor-parallel group of workers) and the scheduler core that
plans its steps. Each replica has its own block pool and running batch (data parallel)."""
import asyncio
import dataclasses
import itertools
import logging
import time
from collections import deque

from protocol.worker_messages import Heartbeat, StepPlan, StepResult, WorkerHello
from scheduler_svc.config import SchedulerConfig, WorkerCapacity
from scheduler_svc.scheduler import Scheduler

logger = logging.getLogger("stepserve.scheduler")


class WorkerLost(Exception):
    """The replica's worker died or went silent; its in-flight step will never answer."""


class Replica:
    def __init__(self, name: str, hello: WorkerHello, config: SchedulerConfig):
        self.name = name  # the group's key: worker_id, or the TP group id
        self.hello = hello
        self.identities: dict[int, bytes] = {}  # rank -> ROUTER identity
        self.worker_ids: dict[int, str] = {}  # rank -> worker_id
        capacity = WorkerCapacity.from_hello(hello)
        if config.preemption_mode != "swap":  # the worker's CPU blocks go unused: no swap space
            capacity = dataclasses.replace(capacity, num_cpu_blocks=0)
        self.core = Scheduler(config, capacity)
        if config.enable_prefix_caching and hello.pooling is not None:
            logger.info("replica %s: prefix caching off: %s is a pooling model (%s), whose requests keep no KV",
                        name, hello.model, hello.pooling.task)
        elif config.enable_prefix_caching and not self.core.enable_prefix_caching:
            logger.info("replica %s: prefix caching off: %s keeps per-request state (%d state slots) "
                        "that a cached prefix cannot restore", name, hello.model, hello.num_state_slots)
        self.alive = True
        self.last_seen: dict[str, float] = {}  # worker_id -> when it last said anything
        self.wakeup = asyncio.Event()
        # The worker's answer to each plan sent and not yet applied, by step id; the plans
        # themselves, and their order, are the core's (Scheduler.oldest_plan_in_flight).
        self.answers: dict[int, asyncio.Future] = {}
        self.sent_at: dict[int, float] = {}  # step id -> when it was sent, until its answer came
        self.last_heartbeat: dict[str, Heartbeat] = {}  # by worker_id
        self.num_steps = 0
        self.num_routed_by_prefix = 0  # requests sent here by prefix routing (scheduler_svc/routing.py)
        # Recent steps: (when the answer came, seconds the worker spent executing it).
        self.recent_steps: deque[tuple[float, float]] = deque(maxlen=256)

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

    def begin_step(self, plan: StepPlan) -> None:
        """plan, from this replica's core, is sent: its answer is awaited."""
        assert plan.step_id not in self.answers, "a plan is sent once"
        self.answers[plan.step_id] = asyncio.get_running_loop().create_future()
        self.sent_at[plan.step_id] = time.monotonic()

    def step_waiting_for(self, now: float) -> float:
        """How long the oldest step sent has gone unanswered (0 with none): a worker whose
        heartbeat thread still beats while its step hangs (a kernel wedged with the GIL released)
        is silent here only."""
        return now - min(self.sent_at.values()) if self.sent_at else 0.0

    async def oldest_result(self) -> tuple[StepPlan, StepResult]:
        """The oldest step in flight and its result, once it came; WorkerLost if it never will."""
        plan = self.core.oldest_plan_in_flight
        result = await self.answers[plan.step_id]
        if not self.alive:  # dropped after the answer came: its core no longer holds the step
            raise WorkerLost(self.name)
        del self.answers[plan.step_id]
        return plan, result

    def deliver(self, result: StepResult) -> bool:
        """Hands the worker's answer to the waiting step; False if it answers no live step."""
        self.seen(self.worker_ids[0])
        future = self.answers.get(result.step_id)
        if future is None or future.done():
            return False
        del self.sent_at[result.step_id]
        self.num_steps += 1
        self.recent_steps.append((time.monotonic(), result.busy_s))
        future.set_result(result)
        return True

    def fail(self) -> None:
        self.alive = False
        self.wakeup.set()
        for future in self.answers.values():
            if not future.done():
                future.set_exception(WorkerLost(self.name))
                future.exception()  # marked retrieved: the step loop awaits the oldest step's alone, then ends
        self.answers.clear()
        self.sent_at.clear()

    def step_timing(self) -> tuple[float, float]:
        """Over the recent steps: the mean time between answers (ms), and the fraction of that
        wall time the worker spent executing steps (the rest it waited for the next plan)."""
        steps = self.recent_steps
        if len(steps) < 2:
            return 0.0, 0.0
        wall = steps[-1][0] - steps[0][0]
        if wall <= 0:
            return 0.0, 0.0
        busy = sum(busy_s for _, busy_s in itertools.islice(steps, 1, None))
        return 1000 * wall / (len(steps) - 1), min(1.0, busy / wall)
