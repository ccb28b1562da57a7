"""Does throughput hold as the queue grows? One cluster, sizes measured back to back, so the
ratio is taken in one run on the same warm processes (this machine is shared and noisy).

    python -m benchmarks.scaling --model tiny-llama --sizes 10000,100000,10000 --json

Each size is measured like `stepserve bench throughput` (random 16-token prompts, 16 output
tokens, ignore_eos, greedy, every prompt handed over at once). The ratio is the largest size's
requests/s over the mean of the others'.
"""
import argparse
import asyncio
import json
import statistics
import sys

from client_sdk.client import AsyncClient
from stepserve.bench.throughput import add_throughput_args, measure
from stepserve.cluster_args import add_cluster_flags, service_address


async def run(args: argparse.Namespace) -> int:
    sizes = [int(s) for s in args.sizes.split(",")]
    results = []
    with service_address(args) as address:
        client = AsyncClient(address)
        try:
            for i, size in enumerate(sizes):
                args.num_prompts, args.seed = size, i
                result = await measure(client, args)
                results.append(result)
                print(f"{size:>9} prompts: {result['requests_per_second']:8.2f} requests/s "
                      f"({result['elapsed_s']} s)", flush=True)
                if args.json:
                    print(json.dumps(result), flush=True)
        finally:
            await client.close()
    largest = max(range(len(sizes)), key=lambda i: sizes[i])
    others = [r["requests_per_second"] for i, r in enumerate(results) if i != largest]
    if others:
        ratio = results[largest]["requests_per_second"] / statistics.mean(others)
        summary = {"largest": sizes[largest], "ratio_to_mean_of_others": round(ratio, 3),
                   "requests_per_second": [r["requests_per_second"] for r in results], "sizes": sizes}
        print(f"requests/s at {sizes[largest]} / mean of the others: {ratio:.3f}")
        if args.json:
            print(json.dumps(summary))
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scaling")
    add_cluster_flags(parser)
    add_throughput_args(parser)
    parser.add_argument("--sizes", default="10000,100000,10000")
    return asyncio.run(run(parser.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
