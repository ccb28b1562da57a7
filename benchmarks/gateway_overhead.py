"""The gateway's cost per request: `stepserve bench serve` through the HTTP gateway and through
the SDK, side by side on one cluster, at several request rates, modes alternated A B A B.

    python -m benchmarks.gateway_overhead --model tiny-llama --rates 20,50,100,inf --rounds 2

Prints one row per rate and mode (medians over the rounds) and the gateway process's CPU time
per request (from /proc), then one JSON object.
"""
import argparse
import asyncio
import json
import os
import statistics
import sys

from client_sdk.client import AsyncClient
from stepserve.bench.serving import add_serving_args, measure
from stepserve.cluster_args import add_cluster_flags, cluster_args
from stepserve.launcher import LocalCluster

KEYS = ("request_throughput", "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "median_itl_ms", "mean_e2el_ms")


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


async def run(args: argparse.Namespace) -> dict:
    scheduler, worker = cluster_args(args)
    rows = []
    with LocalCluster(args.model, args.data_parallel_size, scheduler_args=scheduler, worker_args=worker,
                      tensor_parallel_size=args.tensor_parallel_size) as cluster:
        base_url = cluster.start_gateway()
        gateway_pid = cluster.gateways[0].pid
        async with AsyncClient(cluster.address, timeout_s=60) as client:
            await client.wait_for_workers(cluster.num_worker_processes, timeout_s=600)
        for rate in args.rates:
            args.request_rate = rate
            runs = {"sdk": [], "http": []}
            cpu = []
            for _ in range(args.rounds):
                for mode in ("sdk", "http"):  # A B A B
                    before = cpu_seconds(gateway_pid)
                    result = await measure(args, base_url if mode == "http" else None,
                                           cluster.address if mode == "sdk" else None)
                    if result["failed"]:
                        raise RuntimeError(f"{result['failed']} requests failed: {result['errors']}")
                    if mode == "http":  # the warm-up's 4 requests count too
                        cpu.append((cpu_seconds(gateway_pid) - before) / (args.num_prompts + 4) * 1000)
                    runs[mode].append(result)
            for mode, results in runs.items():
                row = {"rate": rate, "mode": mode, **{k: statistics.median(r[k] for r in results) for k in KEYS}}
                if mode == "http":
                    row["gateway_cpu_ms_per_request"] = statistics.median(cpu)
                rows.append(row)
            print_rows(rows[-2:])
    return {"rows": rows, "config": {k: v for k, v in vars(args).items() if k != "func"}}


def print_rows(rows: list[dict]) -> None:
    for row in rows:
        cpu = f"{row['gateway_cpu_ms_per_request']:.2f}" if "gateway_cpu_ms_per_request" in row else "-"
        print(f"rate {row['rate']:>6} {row['mode']:>4}: {row['request_throughput']:7.2f} req/s  TTFT median "
              f"{row['median_ttft_ms']:7.1f} ms p99 {row['p99_ttft_ms']:7.1f}  TPOT {row['median_tpot_ms']:6.1f} ms  "
              f"ITL {row['median_itl_ms']:6.1f} ms  E2E mean {row['mean_e2el_ms']:7.1f} ms  gateway CPU {cpu} ms/req",
              flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gateway_overhead")
    add_cluster_flags(parser)
    add_serving_args(parser)
    parser.set_defaults(temperature=0.0)  # greedy, as its figures were measured
    parser.add_argument("--rates", type=lambda s: [float(x) for x in s.split(",")], default=[20.0, 50.0, float("inf")])
    parser.add_argument("--rounds", type=int, default=2)
    result = asyncio.run(run(parser.parse_args(argv)))
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
