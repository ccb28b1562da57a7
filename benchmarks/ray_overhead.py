"""What Ray costs the service: 2 replicas under `stepserve up --ray` (RayCluster: the scheduler
and each worker placed as Ray actors, on a local Ray started for the run) against 2 under
`stepserve up` (LocalCluster), modes alternated (ray, local, local, ray, ...), medians. Each run
starts its own cluster and measures like `stepserve bench throughput` (random prompt ids,
exactly --output-len new tokens, greedy, every prompt handed over at once, generation timed),
and its start-up: for Ray, from ray.init to every worker joined, and ray.init alone.

    flock /tmp/stepserve-bench.lock python -m benchmarks.ray_overhead --model micro-llama --num-prompts 10000 --json
"""
import argparse
import sys
import time

from benchmarks.cpu_info import cpu_summary
from benchmarks.mode_runs import medians_by_mode, mode_parser, mode_summary, run_mode_benchmark, run_rounds
from client_sdk.client import AsyncClient
from stepserve.bench.throughput import measure
from stepserve.cluster_args import cluster_args
from stepserve.launcher import LocalCluster

MODES = ("ray", "local")


async def run_once(args: argparse.Namespace, mode: str) -> dict:
    scheduler, worker = cluster_args(args)
    spec = LocalCluster(args.model, args.data_parallel_size, scheduler_args=scheduler, worker_args=worker,
                        tensor_parallel_size=args.tensor_parallel_size)
    if mode == "ray":
        from stepserve.ray_cluster import RayCluster  # starts a local Ray, and shuts it down at stop()
        cluster = RayCluster(spec)
    else:
        cluster = spec
    started = time.monotonic()
    with cluster:  # __enter__ starts it
        startup_s = time.monotonic() - started
        client = AsyncClient(cluster.address)
        try:
            result = await measure(client, args)
        finally:
            await client.close()
    ray_init_s = getattr(cluster, "ray_init_s", None)
    return {"mode": mode, "startup_s": round(startup_s, 2), "ray_init_s": ray_init_s and round(ray_init_s, 2),
            **result}


async def run(args: argparse.Namespace) -> dict:
    cpu = cpu_summary()
    rows = await run_rounds(
        args, MODES, lambda mode: run_once(args, mode),
        lambda row: (f"round {row['round']} {row['mode']:>5}: {row['requests_per_second']:9.2f} requests/s, "
                     f"start-up {row['startup_s']:.1f} s" + (f" (ray.init {row['ray_init_s']:.1f} s)"
                                                             if row["ray_init_s"] else "")),
        mirror_odd_rounds=True)
    summary = mode_summary(args, cpu, rows, "mode", MODES, ("requests_per_second", "startup_s"),
                           data_parallel_size=args.data_parallel_size)
    summary["ray"].update(medians_by_mode(rows, "mode", ["ray"], ["ray_init_s"])["ray"])
    print(f"{args.model}, {args.data_parallel_size} replicas: ray {summary['ray']['requests_per_second']:.2f} / local "
          f"{summary['local']['requests_per_second']:.2f} requests/s (medians of {args.rounds}) = "
          f"{summary['ray_over_local']:.3f}x; start-up {summary['ray']['startup_s']:.1f} s on Ray (ray.init "
          f"{summary['ray']['ray_init_s']:.1f} s) / {summary['local']['startup_s']:.1f} s   [{cpu}]")
    return summary


def main(argv=None) -> int:
    parser = mode_parser("python -m benchmarks.ray_overhead", __doc__, "ray/local pairs")
    parser.set_defaults(model="micro-llama", num_prompts=10000, data_parallel_size=2, rounds=2)
    return run_mode_benchmark(parser, run, argv)


if __name__ == "__main__":
    sys.exit(main())
