"""Where a decode step's time goes for one user, and for a few: the step at batch 1, 2, 4 and 8.

    python -m benchmarks.one_user --model qwen3-0.6b --json /tmp/one_user.json
    python -m benchmarks.one_user --model FOLDER --batches 1,4 --served --temperature 1.0

In process, a ModelRunner as a worker holds it (the same thread count, OMP_WAIT_POLICY=PASSIVE
as the worker process sets it): `--batch` requests of --input-len tokens are prefilled, then the
batches take turns, --steps decode steps each (A B A B: a noisy host slows them alike), and per
batch the median step, and the mean of --profile-steps more under torch.profiler with its parts:
- linear: the linear layers and the head (stepserve::linear, or oneDNN's and aten's GEMMs);
- attention: the paged attention op (its K/V write included);
- elementwise: the compiled graph's own kernels, inductor's fusions of the norms, rotary
  embedding, activations and residual adds (eager: every other aten op);
- sampling: the runner's sampler (a greedy step's argmax runs in the graph: elementwise);
- other: the profiled steps' wall time beside these: the runner's Python (the plan, the inputs,
  the metadata), the compiled graph's guards and call.
And the weights a step reads (stepserve/bench/model_flops.py's weight_bytes: every linear layer and
the head) over the linear layers' time and over the whole step, against the machine's memory
bandwidth of the same minutes (memory_gbps: the median of a float32 sum over 1 GiB on all cores,
as benchmarks/matmul_limit.py measures it, one pass before every round of steps; this host's
bandwidth has moved between 42 and 78 GB/s from one minute to the next).

Served (--served): `stepserve serve`'s processes (the default replicas; a gateway) on the same
model, and per batch B, B streamed requests of --served-output-len tokens over HTTP, at once. Once
the scheduler has seen --window steps of pure decoding: the clients' inter-token latency (median)
and TPOT, the scheduler's step interval (wall time between step results) and the part of it the
worker spent executing the step (the rest it waited for the plan and sent its answer), and the
CPU time each process spent per step (/proc: the worker's threads together, the scheduler's, the
gateway's: on a machine of few cores the last two share the cores the step runs on).
"""
import argparse
import asyncio
import json
import os
import statistics
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the worker process sets it, before torch loads

import numpy as np  # noqa: E402
import torch  # noqa: E402

from benchmarks.cpu_info import cpu_summary  # noqa: E402
from protocol.sampling import SamplingParams  # noqa: E402
from protocol.worker_messages import NewRequestData, RunningRequestData, StepPlan  # noqa: E402
from stepserve.bench.model_flops import DTYPE_BYTES, weight_bytes  # noqa: E402

LINEAR_OPS = ("stepserve::linear", "mkldnn::_linear_pointwise", "aten::linear", "aten::addmm", "aten::mm")
GRAPH_CALL = "## Call CompiledFxGraph"
KINDS = ("linear", "attention", "elementwise", "sampling", "other")


def kind_of(op_name: str, compiled: bool) -> str | None:
    """The part a profiled operator's self time belongs to; None: counted in no part of its own."""
    if op_name in LINEAR_OPS:
        return "linear"
    if op_name == "stepserve::attention":
        return "attention"
    if op_name == "sampling":
        return "sampling"
    if compiled:
        return "elementwise" if op_name.startswith(GRAPH_CALL) else None
    return "elementwise" if op_name.startswith("aten::") else None


class Batch:
    """`size` requests held by the runner, decoding one token each per step."""

    def __init__(self, runner, size: int, index: int, args):
        self.runner, self.size = runner, size
        block_size = runner.block_size
        blocks = -(-(args.input_len + args.steps + args.profile_steps + 8) // block_size)
        first_block = index * 8 * blocks  # room for 8 requests of every batch
        params = SamplingParams(temperature=args.temperature, max_tokens=1 << 20, ignore_eos=True, seed=index)
        rng = np.random.default_rng(index)
        self.ids = [f"b{size}-{i}" for i in range(size)]
        news = [NewRequestData(self.ids[i], rng.integers(4, runner.vocab_size, args.input_len).tolist(),
                               args.input_len, params,
                               list(range(first_block + i * blocks, first_block + (i + 1) * blocks)), 0,
                               args.input_len)
                for i in range(size)]
        self.step_id = index << 32
        assert runner.execute(StepPlan(self.step_id, [], [], news, [])).error is None
        self.times: list[float] = []

    def step(self) -> float:
        self.step_id += 1
        plan = StepPlan(self.step_id, [], [], [], [RunningRequestData(i, [], 1) for i in self.ids])
        start = time.perf_counter()
        result = self.runner.execute(plan)
        elapsed = time.perf_counter() - start
        assert result.error is None, result.error
        return elapsed


def in_process(args) -> dict:
    from worker_svc.runner import ModelRunner
    from worker_svc.runner_config import RunnerConfig
    batches_wanted = [int(b) for b in args.batches.split(",")]
    assert max(batches_wanted) <= 8
    block_size = 16
    blocks = -(-(args.input_len + args.steps + args.profile_steps + 8) // block_size)
    runner = ModelRunner(RunnerConfig(model=args.model, dtype=args.dtype, block_size=block_size,
                                      num_gpu_blocks=8 * blocks * len(batches_wanted),
                                      enforce_eager=args.enforce_eager))
    sample = runner._sample

    def timed_sample(*a, **kw):
        with torch.profiler.record_function("sampling"):
            return sample(*a, **kw)
    runner._sample = timed_sample
    batches = [Batch(runner, size, i, args) for i, size in enumerate(batches_wanted)]
    for batch in batches:  # first-call allocations, not counted
        for _ in range(3):
            batch.step()
    stream = torch.ones(1 << 28, dtype=torch.float32)  # 1 GiB, read between the steps: the bandwidth of the moment
    stream.sum()
    passes = []
    for _ in range(args.steps):
        start = time.perf_counter()
        stream.sum()
        passes.append(time.perf_counter() - start)
        for batch in batches:
            batch.times.append(batch.step())
    del stream
    config = runner.loaded.config
    dtype_name = runner.loaded.dtype_name
    read = weight_bytes(config, DTYPE_BYTES[dtype_name])
    compiled = runner.executor.compiled
    rows = {}
    for batch in batches:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            profiled_ms = sum(batch.step() for _ in range(args.profile_steps)) / args.profile_steps * 1e3
        parts = dict.fromkeys(KINDS, 0.0)
        for event in prof.key_averages():
            kind = kind_of(event.key, compiled)
            if kind is not None:
                total = event.cpu_time_total if kind == "sampling" else event.self_cpu_time_total
                parts[kind] += total / args.profile_steps / 1e3
        # The parts are of the profiled steps, the rest their own wall time beside them (a noisy
        # host's bandwidth changes from minute to minute: the timed steps' median is apart).
        parts["other"] = max(0.0, profiled_ms - sum(parts[k] for k in KINDS if k != "other"))
        step_ms = statistics.median(batch.times) * 1e3
        rows[batch.size] = {
            "step_ms": round(step_ms, 2), "profiled_step_ms": round(profiled_ms, 2),
            **{f"{k}_ms": round(v, 2) for k, v in parts.items()},
            "tokens_per_s": round(batch.size / step_ms * 1e3, 1),
            "weights_gbps_in_linear": round(read / parts["linear"] / 1e6, 1) if parts["linear"] else None,
            "weights_gbps_in_step": round(read / step_ms / 1e6, 1)}
    return {"model": runner.loaded.name, "dtype": dtype_name, "compiled": compiled,
            "threads": torch.get_num_threads(), "weight_bytes": read,
            "memory_gbps": round((1 << 30) / statistics.median(passes) / 1e9, 2), "batches": rows}


# ---- served ------------------------------------------------------------------------------------

def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


async def _served_batch(cluster, client, session, url: str, size: int, args) -> dict:
    from stepserve.bench.serving import _http_request
    processes = {"worker": [p.pid for p in cluster.worker_procs], "scheduler": [cluster.scheduler.pid],
                 "gateway": [p.pid for p in cluster.gateways]}
    params = SamplingParams(max_tokens=args.served_output_len, ignore_eos=True)
    rng = np.random.default_rng(size)
    prompts = [rng.integers(4, 200, args.input_len).tolist() for _ in range(size)]
    requests = [asyncio.ensure_future(_http_request(session, url, None, p, params, args.temperature))
                for p in prompts]

    async def snapshot():
        health = await client.health()
        busiest = max(health.replicas, key=lambda r: r.num_running)
        cpu = {name: sum(_cpu_seconds(pid) for pid in pids) for name, pids in processes.items()}
        return time.perf_counter(), busiest, cpu

    async def steps_of(name: str) -> int:
        return next(r.num_steps for r in (await client.health()).replicas if r.name == name)

    first = None
    while first is None or first[1].num_running < size:
        await asyncio.sleep(0.05)
        first = await snapshot()
    start_steps = first[1].num_steps
    while await steps_of(first[1].name) < start_steps + args.window:
        await asyncio.sleep(0.05)
    last = await snapshot()
    results = await asyncio.gather(*requests)
    assert all(r.ok for r in results), [r.error for r in results if not r.ok]
    steps = last[1].num_steps - start_steps
    interval_ms = (last[0] - first[0]) / steps * 1e3
    busy_ms = last[1].worker_busy_fraction * last[1].mean_step_time_ms
    itls = [x for r in results for x in r.itls]
    tpots = [(r.latency - r.ttft) / (r.num_output_tokens - 1) for r in results]
    return {"itl_p50_ms": round(statistics.median(itls) * 1e3, 2),
            "tpot_ms": round(statistics.median(tpots) * 1e3, 2),
            "step_interval_ms": round(interval_ms, 2), "worker_busy_ms": round(busy_ms, 2),
            "worker_waiting_ms": round(max(0.0, interval_ms - busy_ms), 2),
            **{f"{name}_cpu_ms_per_step": round((last[2][name] - first[2][name]) / steps * 1e3, 2)
               for name in processes},
            "output_tokens_per_s": round(size / interval_ms * 1e3, 1)}


async def served(args) -> dict:
    import aiohttp

    from client_sdk.client import AsyncClient
    from stepserve.launcher import LocalCluster
    worker_args = ["--dtype", args.dtype] + (["--enforce-eager"] if args.enforce_eager else [])
    with LocalCluster(args.model, worker_args=worker_args, announce=True) as cluster:
        url = cluster.start_gateway().rstrip("/") + "/v1/completions"
        async with AsyncClient(cluster.address) as client, aiohttp.ClientSession() as session:
            rows = {}
            for size in (int(b) for b in args.batches.split(",")):
                rows[size] = await _served_batch(cluster, client, session, url, size, args)
                print(f"served batch {size}: {rows[size]}", file=sys.stderr, flush=True)
            return {"replicas": cluster.data_parallel_size, "batches": rows}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen3-0.6b", help="a preset or a model folder")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--batches", default="1,2,4,8", help="comma-separated, each at most 8")
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--steps", type=int, default=40, help="timed decode steps per batch, in process")
    parser.add_argument("--profile-steps", type=int, default=10)
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    parser.add_argument("--enforce-eager", action="store_true")
    parser.add_argument("--served", action="store_true", help="also through stepserve serve's processes")
    parser.add_argument("--served-output-len", type=int, default=320)
    parser.add_argument("--window", type=int, default=256,
                        help="decode steps the served figures span (the scheduler's window of recent steps)")
    parser.add_argument("--json", default=None, help="also write the result here")
    args = parser.parse_args(argv)
    result = {"cpu": cpu_summary(), "config": vars(args)}
    result["in_process"] = in_process(args)
    if args.served:
        result["served"] = asyncio.run(served(args))
    info = result["in_process"]
    print(f"{result['cpu']}; memory {info['memory_gbps']} GB/s")
    print(f"{info['model']} {info['dtype']} {'compiled' if info['compiled'] else 'eager'}, {info['threads']} threads, "
          f"{info['weight_bytes'] / 1e9:.2f} GB of weights a step")
    for size, row in info["batches"].items():
        parts = " + ".join(f"{k} {row[k + '_ms']}" for k in KINDS)
        print(f"batch {size}: step {row['step_ms']} ms; profiled {row['profiled_step_ms']} = {parts}; weights read at {row['weights_gbps_in_linear']} "
              f"GB/s in the linear layers, {row['weights_gbps_in_step']} GB/s over the step "
              f"({row['weights_gbps_in_step'] / info['memory_gbps']:.0%} of memory_gbps)")
    for size, row in result.get("served", {}).get("batches", {}).items():
        print(f"served batch {size}: ITL p50 {row['itl_p50_ms']} ms, TPOT {row['tpot_ms']}; step every "
              f"{row['step_interval_ms']} ms = worker busy {row['worker_busy_ms']} + waiting {row['worker_waiting_ms']}; "
              f"CPU ms a step: worker {row['worker_cpu_ms_per_step']}, scheduler {row['scheduler_cpu_ms_per_step']}, "
              f"gateway {row['gateway_cpu_ms_per_step']}")
    print(json.dumps(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
