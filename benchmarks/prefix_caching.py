"""Prefix caching on vs off, in one script: modes alternate (on, off, on, off, ...), medians.

Two workloads, each measured like `stepserve bench throughput` (random prompt ids, exactly
--output-len new tokens, greedy, every prompt handed over at once, generation timed):
    shared     every prompt is one shared --prefix-len random prefix + --input-len own tokens
    unshared   the same prompts without the shared prefix: what caching costs where it cannot help
Every run starts its own local cluster, so the cache starts cold and runs do not share state.

    python -m benchmarks.prefix_caching --model tiny-llama --rounds 3 --json
    python -m benchmarks.prefix_caching --workloads unshared --rounds 5 --lock-file /tmp/cpu.lock

--lock-file takes an exclusive flock around each run (not the whole script), so a long series
shares a machine with other heavy jobs without holding it between runs.
"""
import argparse
import asyncio
import contextlib
import copy
import fcntl
import json
import statistics
import sys

from benchmarks.cpu_info import cpu_summary
from benchmarks.throughput import add_throughput_args, measure
from client_sdk.client import AsyncClient
from client_sdk.cluster_args import add_cluster_flags, cluster_args
from client_sdk.launcher import LocalCluster

MODES = {"on": "--enable-prefix-caching", "off": "--no-enable-prefix-caching"}


@contextlib.contextmanager
def maybe_locked(path: str | None):
    if path is None:
        yield
        return
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


async def run_once(args: argparse.Namespace, workload: str, mode: str) -> dict:
    run_args = copy.copy(args)
    run_args.prefix_len = args.prefix_len if workload == "shared" else 0
    run_args.enable_prefix_caching = None  # the mode's flag below decides
    scheduler, worker = cluster_args(run_args)
    with maybe_locked(args.lock_file), LocalCluster(args.model, args.workers, scheduler_args=scheduler + [MODES[mode]],
                                                    worker_args=worker) as cluster:
        client = AsyncClient(cluster.address)
        try:
            result = await measure(client, run_args)
        finally:
            await client.close()
    return {"workload": workload, "prefix_caching": mode, **result}


async def run(args: argparse.Namespace) -> int:
    cpu = cpu_summary()
    rows = []
    for workload in args.workloads.split(","):
        for round_index in range(args.rounds):
            for mode in MODES:  # alternating within every round: on, off, on, off, ...
                row = await run_once(args, workload, mode)
                row["round"] = round_index
                rows.append(row)
                print(f"{workload:>8} round {round_index} caching {mode:>3}: {row['requests_per_second']:9.2f} "
                      f"requests/s ({row['elapsed_s']} s, {row['prefix_cache_hits']} of "
                      f"{row['prefix_cache_queries']} tokens found cached)", flush=True)
                if args.json:
                    print(json.dumps(row), flush=True)
    summary = {"cpu": cpu, "model": args.model, "num_prompts": args.num_prompts, "prefix_len": args.prefix_len,
               "input_len": args.input_len, "output_len": args.output_len, "rounds": args.rounds}
    for workload in args.workloads.split(","):
        median = {mode: statistics.median(r["requests_per_second"] for r in rows
                                          if r["workload"] == workload and r["prefix_caching"] == mode)
                  for mode in MODES}
        summary[workload] = {"median_requests_per_second_on": median["on"],
                             "median_requests_per_second_off": median["off"],
                             "on_over_off": round(median["on"] / median["off"], 3)}
        print(f"{workload}: caching on {median['on']:.2f} / off {median['off']:.2f} requests/s (medians of "
              f"{args.rounds}) = {median['on'] / median['off']:.3f}x   [{cpu}]")
    if args.json:
        print(json.dumps(summary))
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.prefix_caching", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_cluster_flags(parser)
    add_throughput_args(parser)
    parser.set_defaults(num_prompts=2000, prefix_len=1024, input_len=32, output_len=16)
    parser.add_argument("--rounds", type=int, default=3, help="on/off pairs per workload")
    parser.add_argument("--workloads", default="shared,unshared")
    parser.add_argument("--lock-file", default=None, help="flock this file around each run")
    args = parser.parse_args(argv)
    if args.address is not None:
        parser.error("--address: each run starts its own cluster")
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
