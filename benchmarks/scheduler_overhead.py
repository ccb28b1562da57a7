"""Scheduler core overhead alone: cost of schedule() + update() with N requests waiting.

A fake executor returns random tokens, so the numbers are the core's own Python work. The
waiting queue is held at N (each finished request is replaced, outside the timed region),
and the same number of steady-state steps with a full running batch is timed for every size.

    python -m benchmarks.scheduler_overhead --sizes 1000,10000,100000,1000000 --json
    python -m benchmarks.scheduler_overhead --sizes 1000,1000000 --enable-prefix-caching [--prefix-len 64]
    python -m benchmarks.scheduler_overhead --sizes 1000,1000000 --plans-in-flight 2   (async scheduling)

With --enable-prefix-caching the core hashes, looks up and registers blocks as it would serve;
--prefix-len N puts a shared prefix of N tokens before each prompt, so lookups hit and blocks
are shared (the prompt's own --input-len tokens differ, so its last blocks miss); --num-prefixes K
draws it from K prefixes in turn.

With --replicas N the requests wait where the service keeps them, in `pending`, and N cores take
them through the step loop's own refill and router (scheduler_svc/routing.py, --routing); each
replica steps in turn, and a step's time counts its refill too:

    python -m benchmarks.scheduler_overhead --sizes 1000,1000000 --replicas 2 --routing prefix \
        --enable-prefix-caching --prefix-len 512 --num-prefixes 8
"""
import argparse
import gc
import json
import random
import resource
import statistics
import time
from collections import deque

from protocol.sampling import SamplingParams
from protocol.worker_messages import StepResult, WorkerHello
from scheduler_svc.admission import Admission
from scheduler_svc.config import ROUTING_MODES, SchedulerConfig, WorkerCapacity
from scheduler_svc.gc_tuning import tune_gc_for_large_queues
from scheduler_svc.live_requests import LiveRequests
from scheduler_svc.replica_set import ReplicaSet
from scheduler_svc.request import Request
from scheduler_svc.scheduler import Scheduler
from scheduler_svc.step_loop import ReplicaDriver


class RandomTokenExecutor:
    """Stands in for the worker: one random token per scheduled request."""

    def __init__(self, seed: int, vocab_size: int = 32000):
        self._rng = random.Random(seed)
        self._vocab_size = vocab_size

    def run(self, plan) -> StepResult:
        rand = self._rng.randrange
        tokens = [rand(self._vocab_size) for _ in range(plan.num_scheduled)]
        return StepResult(step_id=plan.step_id, sampled_token_ids=tokens)


def _current_rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class Workload:
    def __init__(self, args):
        self.args = args
        self.params = SamplingParams(max_tokens=args.output_len, ignore_eos=True, temperature=0.0)
        rng = random.Random(0)
        self.token_pool = [rng.randrange(32000) for _ in range(4096 + args.input_len)]
        self.prefixes = [[rng.randrange(32000) for _ in range(args.prefix_len)] for _ in range(args.num_prefixes)]
        self.next_id = 0

    def new_request(self) -> Request:
        i = self.next_id
        self.next_id += 1
        start = i % 4096
        prompt = self.prefixes[i % len(self.prefixes)] + self.token_pool[start:start + self.args.input_len]
        return Request(f"req-{i}", prompt, self.params)


class SingleCore:
    """The core alone: every request waits in it."""

    def __init__(self, config: SchedulerConfig, capacity: WorkerCapacity, args):
        self.cores = [Scheduler(config, capacity)]

    def add_request(self, request: Request) -> None:
        self.cores[0].add_request(request)

    def steppers(self):
        return [(self.cores[0], None)]

    @property
    def num_waiting(self) -> int:
        return self.cores[0].num_waiting


class RoutedCores:
    """--replicas N: the service's `pending`, router and replicas, each core refilled by its own
    step-loop driver (the worker's side, sending plans and results, is left out)."""

    def __init__(self, config: SchedulerConfig, capacity: WorkerCapacity, args):
        self.replicas = ReplicaSet(config)
        self.requests = LiveRequests(config, Admission(), self.replicas, None)
        self.drivers = []
        for i in range(args.replicas):
            hello = WorkerHello(worker_id=f"worker-{i}", model="bench", device="cpu", dtype="float32",
                                vocab_size=32000, max_model_len=capacity.max_model_len,
                                block_size=capacity.block_size, num_gpu_blocks=capacity.num_gpu_blocks,
                                num_cpu_blocks=0, num_state_slots=0, eos_token_ids=list(capacity.eos_token_ids),
                                tokenizer_json=None)
            replica = self.replicas.join(f"worker-{i}".encode(), hello)
            self.drivers.append(ReplicaDriver(replica, self.replicas, config, self.requests, send_plan=None,
                                              flush_outputs=None, drop_replica=None, metrics=None,
                                              check_integrity_when_idle=False))
        self.cores = [driver.core for driver in self.drivers]

    def add_request(self, request: Request) -> None:
        self.requests.pending.push(request)

    def steppers(self):
        return [(driver.core, driver.refill) for driver in self.drivers]

    @property
    def num_waiting(self) -> int:
        return self.requests.num_waiting + sum(core.num_waiting for core in self.cores)


def run_size(num_waiting: int, args) -> dict:
    config = SchedulerConfig(max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
                             enable_prefix_caching=args.enable_prefix_caching, routing=args.routing)
    blocks_per_request = -(-(args.prefix_len + args.input_len + args.output_len) // args.block_size)
    capacity = WorkerCapacity(num_gpu_blocks=args.max_num_seqs * blocks_per_request * 2, block_size=args.block_size,
                              max_model_len=2048, eos_token_ids=(2,))
    cluster = (RoutedCores if args.replicas > 1 else SingleCore)(config, capacity, args)
    workload = Workload(args)
    gc.collect()
    rss_before = _current_rss_mb()
    for _ in range(num_waiting):
        cluster.add_request(workload.new_request())
    bytes_per_waiting = (_current_rss_mb() - rss_before) * 2**20 / num_waiting
    if not args.no_gc_tuning:
        tune_gc_for_large_queues()
    executor = RandomTokenExecutor(seed=num_waiting)
    step_us, num_tokens, num_full = [], 0, 0
    perf = time.perf_counter
    steppers = cluster.steppers()
    # per core, (plan, result): with --plans-in-flight 2 the next plan is made first
    inflight = [deque() for _ in steppers]
    for step in range(args.warmup_steps + args.steps):
        for (core, refill), core_inflight in zip(steppers, inflight):
            t0 = perf()
            if refill is not None:
                refill()
            plan = core.schedule()
            t1 = perf()
            if plan is not None:  # None: every running request awaits its last token
                core_inflight.append((plan, executor.run(plan)))
            updates = []
            t2 = perf()
            if core_inflight and (len(core_inflight) == args.plans_in_flight or plan is None):
                updates = core.update(*core_inflight.popleft())
            t3 = perf()
            if step >= args.warmup_steps:
                step_us.append((t1 - t0 + t3 - t2) * 1e6)
                if plan is not None:
                    num_tokens += sum(d.num_new_tokens for d in plan.new_requests)
                    num_tokens += sum(d.num_new_tokens for d in plan.running_requests)
                    num_full += plan.num_scheduled == args.max_num_seqs
            for update in updates:  # hold the queue at num_waiting
                if update.finish_reason is not None:
                    cluster.add_request(workload.new_request())
    assert cluster.num_waiting >= num_waiting - args.max_num_seqs * len(steppers)
    num_steps = len(step_us)
    row = {
        "waiting": num_waiting,
        "us_per_step": round(statistics.median(step_us), 1),
        "us_per_step_mean": round(statistics.fmean(step_us), 1),
        "us_per_step_p99": round(sorted(step_us)[int(num_steps * 0.99)], 1),
        "us_per_token": round(sum(step_us) / num_tokens, 3),
        "tokens_per_step": round(num_tokens / num_steps, 1),
        "full_batch_steps": num_full,
        "steps": num_steps,
        "bytes_per_waiting": round(bytes_per_waiting),
        "peak_rss_mb": round(_peak_rss_mb(), 1),
        "gc_tuning": not args.no_gc_tuning,
        "prefix_caching": args.enable_prefix_caching,
        "plans_in_flight": args.plans_in_flight,
        "replicas": args.replicas,
        "routing": args.routing if args.replicas > 1 else None,
        "prefix_cache_hit_tokens": sum(core.block_manager.num_prefix_cache_hits for core in cluster.cores),
    }
    del cluster, workload
    gc.unfreeze()
    gc.collect()
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000,10000,100000,1000000")
    parser.add_argument("--steps", type=int, default=400, help="timed steady-state steps per size")
    parser.add_argument("--warmup-steps", type=int, default=64)
    parser.add_argument("--input-len", type=int, default=16)
    parser.add_argument("--output-len", type=int, default=16)
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--max-num-batched-tokens", type=int, default=8192)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--no-gc-tuning", action="store_true")
    parser.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=False)
    parser.add_argument("--prefix-len", type=int, default=0, help="a shared prefix before each prompt")
    parser.add_argument("--num-prefixes", type=int, default=1, help="distinct shared prefixes, in turn")
    parser.add_argument("--replicas", type=int, default=1,
                        help="more than 1: cores refilled from `pending` by the step loop, through the router")
    parser.add_argument("--routing", choices=ROUTING_MODES, default="prefix", help="with --replicas N")
    parser.add_argument("--plans-in-flight", type=int, choices=[1, 2], default=1,
                        help="2: async scheduling (the next plan is made before the last result is applied)")
    parser.add_argument("--json", action="store_true", help="one JSON object per size, then the table")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    run_size(1000, args)  # discarded: warms the interpreter and the CPU before the first size
    rows = []
    for size in sizes:
        rows.append(run_size(size, args))
        if args.json:
            print(json.dumps(rows[-1]), flush=True)
    print(f"\nscheduler core overhead: {args.input_len}-token prompts, {args.output_len} output tokens, "
          f"ignore_eos, max_num_seqs {args.max_num_seqs}, max_num_batched_tokens "
          f"{args.max_num_batched_tokens}, block_size {args.block_size}, {args.steps} timed steps "
          f"after {args.warmup_steps} warm-up, gc tuning {'off' if args.no_gc_tuning else 'on'}, "
          f"prefix caching {'on' if args.enable_prefix_caching else 'off'}, shared prefix {args.prefix_len} "
          f"(of {args.num_prefixes}), {args.replicas} replica(s)"
          + (f", routing {args.routing}" if args.replicas > 1 else ""))
    print(f"{'waiting':>10} {'us/step':>9} {'mean':>9} {'p99':>9} {'us/token':>9} {'tok/step':>9} "
          f"{'B/waiting':>10} {'peak RSS MB':>12}")
    for r in rows:
        print(f"{r['waiting']:>10} {r['us_per_step']:>9} {r['us_per_step_mean']:>9} {r['us_per_step_p99']:>9} "
              f"{r['us_per_token']:>9} {r['tokens_per_step']:>9} {r['bytes_per_waiting']:>10} {r['peak_rss_mb']:>12}")
    base = rows[0]["us_per_step"]
    for r in rows[1:]:
        print(f"us_per_step at {r['waiting']} / at {rows[0]['waiting']}: {r['us_per_step'] / base:.3f}")


if __name__ == "__main__":
    main()
