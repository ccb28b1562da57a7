"""What the A/B benchmarks share (prefix_caching.py, async_scheduling.py): their command line,
and one throughput run on a fresh local cluster, optionally under a file lock."""
import argparse
import asyncio
import contextlib
import fcntl
import json
import statistics

from client_sdk.client import AsyncClient
from stepserve.bench.throughput import add_throughput_args, measure
from stepserve.cluster_args import add_cluster_flags, cluster_args
from stepserve.launcher import LocalCluster


def mode_parser(prog: str, doc: str, rounds_help: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_cluster_flags(parser)
    add_throughput_args(parser)
    parser.add_argument("--rounds", type=int, default=3, help=rounds_help)
    parser.add_argument("--lock-file", default=None, help="flock this file around each run")
    return parser


def run_mode_benchmark(parser: argparse.ArgumentParser, run, argv) -> int:
    """Parse the command line, run the series (`run(args)` returns its summary), and print the
    summary as one JSON line with --json."""
    args = parser.parse_args(argv)
    if args.address is not None:
        parser.error("--address: each run starts its own cluster")
    summary = asyncio.run(run(args))
    if args.json:
        print(json.dumps(summary))
    return 0


@contextlib.contextmanager
def maybe_locked(path: str | None):
    """An exclusive flock around one run (not the whole series), so a long series shares a
    machine with other heavy jobs without holding it between runs."""
    if path is None:
        yield
        return
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


async def measure_on_fresh_cluster(args: argparse.Namespace, extra_scheduler_args: list[str] = ()) -> dict:
    """`stepserve bench throughput`'s measurement on a local cluster started from args' flags."""
    scheduler, worker = cluster_args(args)
    with maybe_locked(args.lock_file), LocalCluster(args.model, args.data_parallel_size,
                                                    scheduler_args=scheduler + list(extra_scheduler_args),
                                                    worker_args=worker) as cluster:
        client = AsyncClient(cluster.address)
        try:
            return await measure(client, args)
        finally:
            await client.close()


async def run_rounds(args: argparse.Namespace, modes, run_one, describe, mirror_odd_rounds: bool) -> list[dict]:
    """args.rounds rounds of run_one(mode) for every mode, each row printed (describe(row), and
    as JSON with --json) and returned with its round. mirror_odd_rounds: A B, B A, A B, ..."""
    rows = []
    for round_index in range(args.rounds):
        order = modes[::-1] if mirror_odd_rounds and round_index % 2 else modes
        for mode in order:
            row = await run_one(mode)
            row["round"] = round_index
            rows.append(row)
            print(describe(row), flush=True)
            if args.json:
                print(json.dumps(row), flush=True)
    return rows


def medians_by_mode(rows: list[dict], field: str, modes, keys) -> dict[str, dict]:
    """For each mode (a row's `field`), the median of each key over that mode's rows."""
    return {mode: {key: statistics.median(r[key] for r in rows if r[field] == mode) for key in keys} for mode in modes}


def mode_summary(args: argparse.Namespace, cpu: str, rows: list[dict], field: str, modes, keys, **extra) -> dict:
    """The series' configuration, each mode's medians of keys, and the first mode's requests/s
    over the second's (`A_over_B`)."""
    summary = {"cpu": cpu, "model": args.model, "num_prompts": args.num_prompts, "input_len": args.input_len,
               "output_len": args.output_len, "rounds": args.rounds, **extra,
               **medians_by_mode(rows, field, modes, keys)}
    first, second = modes
    summary[f"{first}_over_{second}"] = round(summary[first]["requests_per_second"]
                                              / summary[second]["requests_per_second"], 3)
    return summary
