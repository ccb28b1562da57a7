"""Random workloads against the scheduler core: adds, aborts at any moment (also mid-step),
resubmitted ids, tiny block pools that force preemption, both preemption modes and policies,
prefix caching on and off over prompts whose prefixes are shared, partly shared or not.

Invariants checked every step: budgets; the worker's mirrored block tables equal the
scheduler's; the mirrored KV contents (tests/scheduler_fakes.py) show every request reads its
own tokens' KV and writes only into blocks no one else holds; every finish and abort appears
exactly once in the next plan's finished_ids; integrity (blocks, ref counts, cache and queues).
At the end: every accepted request finished exactly once and every block is free, with a ref
count of zero.

Every workload runs with one plan in flight (sync) or two (async scheduling: the next plan is
made before the result of the one in flight is applied, as the service does with
--async-scheduling); the fake worker runs each plan as it is made, like the real one.
"""
import random
from collections import Counter, deque

from hypothesis import event, given, settings, strategies as st
from hypothesis.control import currently_in_test_context

from protocol.sampling import SamplingParams
from scheduler_svc.config import SchedulerConfig, WorkerCapacity
from scheduler_svc.errors import RequestRejected
from scheduler_svc.request import Request
from scheduler_svc.scheduler import Scheduler
from tests.scheduler_fakes import FakeWorker

EOS, STOP = 10, 11

configs = st.builds(
    dict,
    block_size=st.sampled_from([1, 2, 4]),
    num_gpu_blocks=st.integers(3, 12),
    num_cpu_blocks=st.sampled_from([0, 3, 16]),
    num_state_slots=st.sampled_from([0, 0, 0, 2, 5]),
    max_model_len=st.integers(6, 48),
    max_num_seqs=st.integers(1, 8),
    max_num_batched_tokens=st.integers(2, 24),
    preemption_mode=st.sampled_from(["recompute", "swap"]),
    policy=st.sampled_from(["fcfs", "priority"]),
    enable_chunked_prefill=st.booleans(),
    enable_prefix_caching=st.sampled_from([True, True, False]),
)
# add: prompt_len, max_tokens, min_tokens, priority, ignore_eos, prefix family (0: none), shared len
adds = st.tuples(st.just("add"), st.integers(1, 14), st.integers(1, 24), st.integers(0, 3),
                 st.integers(0, 2), st.booleans(), st.integers(0, 4), st.integers(0, 14))
# Family 3 shares family 1's head; family 4 has family 1's tokens after a different head, so a
# hash that forgot the blocks before it would hand out the wrong KV.
FAMILIES = [[], list(range(30, 44)), list(range(50, 64)), [30, 31, 32, 33] + list(range(70, 80)),
            [90, 91, 92, 93] + list(range(34, 44))]
ops = st.lists(st.one_of(
    adds, adds, adds,
    st.tuples(st.just("abort"), st.integers(0, 30)),
    st.tuples(st.just("abort_mid_step"), st.integers(0, 30)),
    st.tuples(st.just("step")),
    st.tuples(st.just("step")),
), min_size=10, max_size=80)
PLANS_IN_FLIGHT = st.sampled_from([1, 2])  # sync, async


class Harness:
    def __init__(self, cfg: dict, seed: int, plans_in_flight: int = 1, deterministic: bool = False):
        capacity = WorkerCapacity(num_gpu_blocks=cfg.pop("num_gpu_blocks"), block_size=cfg.pop("block_size"),
                                  num_cpu_blocks=cfg.pop("num_cpu_blocks"),
                                  num_state_slots=cfg.pop("num_state_slots"),
                                  max_model_len=cfg.pop("max_model_len"), eos_token_ids=(EOS,))
        self.config = SchedulerConfig(**cfg)
        self.scheduler = Scheduler(self.config, capacity)
        self.worker = FakeWorker(capacity.block_size, vocab=list(range(10, 30)), seed=seed,
                                 deterministic=deterministic)
        self.plans_in_flight = plans_in_flight
        # Deterministic runs compare modes request by request: ids must not depend on timing.
        self.unique_ids = deterministic
        self.num_adds = 0
        self.inflight: deque = deque()  # (plan, result): run by the worker, not applied yet
        self.accepted: list[Request] = []
        self.expected_finished: list[str] = []  # to appear in the next plan's finished_ids
        self.num_finish_events: dict[int, int] = {}  # id(request) -> times it finished
        self.last_step_id = -1
        self.next_unique_token = 1000
        self.events: Counter[str] = Counter()

    def prompt(self, prompt_len, family, num_shared):
        """The first num_shared tokens from a family (families share a head too), the rest unique."""
        shared = FAMILIES[family][:min(num_shared, prompt_len)]
        own = range(self.next_unique_token, self.next_unique_token + prompt_len - len(shared))
        self.next_unique_token += len(own)
        return shared + list(own)

    def add(self, prompt_len, max_tokens, min_tokens, priority, ignore_eos, family=1, num_shared=14):
        # Ids repeat, so aborted-and-resubmitted ids and duplicates of live ids both occur.
        request_id = f"r{len(self.accepted) % 7}"
        self.num_adds += 1
        if self.unique_ids:
            request_id = f"u{self.num_adds}"
        params = SamplingParams(max_tokens=max_tokens, min_tokens=min(min_tokens, max_tokens),
                                ignore_eos=ignore_eos, stop_token_ids=[STOP])
        request = Request(request_id, self.prompt(prompt_len, family, num_shared), params, priority=priority)
        try:
            self.scheduler.add_request(request)
        except RequestRejected:
            return
        self.accepted.append(request)

    def abort(self, index):
        if self.accepted:
            request = self.accepted[index % len(self.accepted)]
            if self.scheduler.abort(request.request_id) is not None:
                self._finished(self.scheduler_request_was(request.request_id, request))

    def scheduler_request_was(self, request_id, hint):
        # The aborted object is the live one with that id (maybe a resubmission, not `hint`).
        for request in reversed(self.accepted):
            if request.request_id == request_id and request.finish_reason == "abort" \
                    and id(request) not in self.num_finish_events:
                return request
        raise AssertionError(f"no aborted request {request_id}")

    def _finished(self, request):
        assert request.is_finished
        self.num_finish_events[id(request)] = self.num_finish_events.get(id(request), 0) + 1
        self.expected_finished.append(request.request_id)

    def step(self, abort_index=None) -> bool:
        """Make a plan (the worker runs it at once) and, once as many plans are in flight as
        the mode allows, or nothing more is to plan, apply the oldest result."""
        if len(self.inflight) < self.plans_in_flight:
            plan = self.scheduler.schedule()
            if plan is not None:
                self.check_plan(plan)
                self.inflight.append((plan, self.worker.run(plan)))
                if len(self.inflight) < self.plans_in_flight:
                    return True
        if not self.inflight:
            assert not self.expected_finished, "pending finished ids but no plan"
            return False
        if len(self.inflight) == 2:
            self.record("two plans in flight")
        plan, result = self.inflight.popleft()
        if -1 in result.sampled_token_ids:
            self.record("prefill chunk short of the end")
        if abort_index is not None:
            self.record("abort mid-step")
            self.abort(abort_index)  # arrives while the step runs
        for update in self.scheduler.update(plan, result):
            if update.finish_reason is not None:
                self._finished(update.request)
        self.check_mirror()
        self.scheduler.check_integrity()
        return True

    def check_plan(self, plan) -> None:
        assert plan.step_id > self.last_step_id
        self.last_step_id = plan.step_id
        assert plan.finished_ids == self.expected_finished, "finished ids lagged, lost or duplicated"
        self.expected_finished = []
        assert plan.num_scheduled <= self.config.max_num_seqs
        num_tokens = sum(d.num_new_tokens for d in plan.new_requests + plan.running_requests)
        assert num_tokens <= self.config.max_num_batched_tokens
        ids = [d.request_id for d in plan.new_requests + plan.running_requests]
        assert len(set(ids)) == len(ids), "a request scheduled twice in one plan"
        assert not set(ids) & set(plan.preempted_ids)
        for kind, happened in (("recompute preemption", plan.preempted_ids and not plan.blocks_to_swap_out),
                               ("swap out", plan.blocks_to_swap_out), ("swap in", plan.blocks_to_swap_in),
                               ("free-only plan", not ids), ("copy-on-write", plan.blocks_to_copy),
                               ("prefix cache hit", any(d.num_computed_tokens and not plan.blocks_to_swap_in
                                                        for d in plan.new_requests))):
            if happened:
                self.record(kind)

    def record(self, kind: str) -> None:
        self.events[kind] += 1
        if currently_in_test_context():
            event(kind)  # hypothesis statistics (--hypothesis-show-statistics)

    def check_mirror(self):
        """The worker's view of each running request equals the scheduler's, ahead of it by
        exactly the steps in flight: their tokens computed, their sampled tokens appended."""
        for request in self.scheduler._running.values():
            mirrored = self.worker.requests[request.request_id]
            assert mirrored.block_ids == request.block_ids
            assert mirrored.token_ids[:request.num_tokens] == request.all_token_ids
            assert len(mirrored.token_ids) == request.num_tokens + request.num_output_placeholders
            assert mirrored.num_computed_tokens == request.num_computed_tokens + request.num_inflight_tokens


@settings(max_examples=250, deadline=None)
@given(configs, ops, st.integers(0, 2**16), PLANS_IN_FLIGHT)
def test_random_workloads_keep_every_invariant(cfg, operations, seed, plans_in_flight):
    harness = Harness(dict(cfg), seed, plans_in_flight)
    scheduler = harness.scheduler
    for op in operations:
        if op[0] == "add":
            harness.add(*op[1:])
        elif op[0] == "abort":
            harness.abort(op[1])
        elif op[0] == "abort_mid_step":
            harness.step(abort_index=op[1])
        else:
            harness.step()
        scheduler.check_integrity()
    for _ in range(5000):  # drain
        if not harness.step():
            break
    else:
        raise AssertionError("no progress: livelock")
    assert scheduler.num_waiting == 0
    assert scheduler.num_running == 0 and scheduler.num_swapped == 0
    assert scheduler.num_free_blocks == scheduler.num_total_blocks
    assert scheduler.block_manager.cpu.num_free == scheduler.block_manager.cpu.num_blocks
    for request in harness.accepted:
        assert request.is_finished and harness.num_finish_events[id(request)] == 1
        if request.finish_reason in ("length", "stop"):
            assert 1 <= len(request.output_token_ids) <= request.params.max_tokens
    assert harness.worker.requests == {}, "the worker still holds state of finished requests"


@settings(max_examples=40, deadline=None)
@given(configs, st.integers(1, 30), st.integers(0, 2**16), PLANS_IN_FLIGHT)
def test_dead_worker_requests_rerun_to_the_end_elsewhere(cfg, num_requests, seed, plans_in_flight):
    harness = Harness(dict(cfg), seed, plans_in_flight)
    rng = random.Random(seed)
    for _ in range(num_requests):
        harness.add(rng.randint(1, 12), rng.randint(1, 8), 0, rng.randint(0, 2), True, rng.randint(0, 4), 12)
    for _ in range(rng.randint(0, 10)):
        harness.step()
    live = [r for r in harness.accepted if not r.is_finished]
    requests = harness.scheduler.take_unfinished()
    assert sorted(map(id, requests)) == sorted(map(id, live))
    assert harness.scheduler.num_free_blocks == harness.scheduler.num_total_blocks
    harness.scheduler.check_integrity()
    harness.worker = FakeWorker(harness.scheduler.capacity.block_size, vocab=list(range(10, 30)), seed=seed)  # fresh
    harness.expected_finished = []
    harness.inflight.clear()  # the dead worker's steps never answer
    for request in requests:
        harness.scheduler.add_request(request)
    while harness.step():
        pass
    assert all(r.finish_reason in ("length", "stop") for r in requests)


@settings(max_examples=60, deadline=None)
@given(configs, st.integers(0, 2**32), PLANS_IN_FLIGHT)
def test_heavy_random_workloads_under_memory_pressure(cfg, seed, plans_in_flight):
    """Long workloads drawn from a seed: many requests at once, so preemption is the norm."""
    run_heavy_workload(cfg, seed, plans_in_flight)


def test_prefix_caching_under_memory_pressure_meets_every_hard_case():
    """Seeded heavy workloads with caching on: shared, partly shared and unshared prefixes
    meet preemption of both kinds, aborts mid-step and copy-on-write, asserted to happen."""
    events = Counter()
    for seed in range(60):
        rng = random.Random(seed)
        cfg = dict(block_size=rng.choice([1, 2, 4]), num_gpu_blocks=rng.randint(3, 12),
                   num_cpu_blocks=rng.choice([0, 16]), num_state_slots=0, max_model_len=rng.randint(6, 48),
                   max_num_seqs=rng.randint(1, 8), max_num_batched_tokens=rng.randint(2, 24),
                   preemption_mode=("recompute", "swap")[seed % 2], policy=rng.choice(["fcfs", "priority"]),
                   enable_chunked_prefill=rng.random() < 0.7, enable_prefix_caching=True)
        harness = run_heavy_workload(cfg, seed, plans_in_flight=1 + seed // 2 % 2)
        events.update(harness.events)
        events["tokens read from the cache"] += harness.worker.num_cached_tokens_read
        events["runs with cache hits"] += harness.scheduler.block_manager.num_prefix_cache_hits > 0
    for kind in ("prefix cache hit", "copy-on-write", "recompute preemption", "swap out", "swap in",
                 "abort mid-step", "prefill chunk short of the end", "two plans in flight"):
        assert events[kind] >= 20, (kind, events)
    assert events["runs with cache hits"] >= 40 and events["tokens read from the cache"] > 1000, events


def run_heavy_workload(cfg: dict, seed: int, plans_in_flight: int = 1, deterministic: bool = False,
                       aborts: bool = True) -> Harness:
    harness = Harness(dict(cfg), seed, plans_in_flight, deterministic)
    rng = random.Random(seed)
    for _ in range(300):
        roll = rng.random()
        if roll < 0.35:
            harness.add(rng.randint(1, 14), rng.randint(1, 24), rng.randint(0, 3), rng.randint(0, 2),
                        rng.random() < 0.5, rng.randint(0, 4), rng.randint(0, 14))
        elif roll < 0.45:
            if aborts:
                harness.abort(rng.randrange(1000))
        elif roll < 0.55:
            harness.step(abort_index=rng.randrange(1000) if aborts else None)
        else:
            harness.step()
    for _ in range(5000):  # drain
        if not harness.step():
            break
    else:
        raise AssertionError("no progress: livelock")
    assert harness.scheduler.num_waiting == harness.scheduler.num_running == harness.scheduler.num_swapped == 0
    assert harness.scheduler.num_free_blocks == harness.scheduler.num_total_blocks
    assert all(harness.num_finish_events[id(r)] == 1 for r in harness.accepted)
    assert harness.worker.requests == {}
    return harness


@settings(max_examples=60, deadline=None)
@given(configs, st.integers(0, 2**32))
def test_async_scheduling_gives_every_request_the_tokens_sync_gives(cfg, seed):
    """A worker whose next token is a function of the tokens so far (greedy decoding): the
    same workload under one plan in flight and under two, preemption included, ends every
    request with the same tokens and the same reason; async runs fewer or as many steps'
    worth of applied results, never a token past the finishing one."""
    outcomes = []
    for plans_in_flight in (1, 2):
        harness = run_heavy_workload(cfg, seed, plans_in_flight, deterministic=True, aborts=False)
        outcomes.append([(r.request_id, r.output_token_ids, r.finish_reason) for r in harness.accepted])
        for request in harness.accepted:
            assert len(request.output_token_ids) <= request.params.max_tokens
    assert outcomes[0] == outcomes[1]
