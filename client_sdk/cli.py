"""The `stepserve` command: `up`, `generate`, `bench throughput`."""
import argparse
import asyncio
import signal
import sys
import threading

from client_sdk.cluster_args import add_cluster_flags, cluster_args, service_address
from client_sdk.launcher import LocalCluster
from client_sdk.sync_client import Client
from protocol.sampling import SamplingParams


def cmd_up(args: argparse.Namespace) -> int:
    scheduler, worker = cluster_args(args)
    cluster = LocalCluster(args.model, args.workers, scheduler_args=scheduler, worker_args=worker,
                           frontend=args.frontend, workers=args.workers_address, quiet=False)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    cluster.start()
    try:
        with Client(cluster.address) as client:
            cluster.wait_for_workers(client, args.workers, timeout_s=600)
        print(f"stepserve up: {args.model} on {args.workers} worker(s); clients connect to {cluster.address}", flush=True)
        while not stop.wait(0.5):
            if cluster.scheduler.poll() is not None:
                print("scheduler exited", file=sys.stderr)
                return 1
    finally:
        cluster.stop()
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                            top_k=args.top_k, seed=args.seed, ignore_eos=args.ignore_eos)
    with service_address(args) as address, Client(address) as client:
        client.wait_for_workers(1, timeout_s=600)
        for prompt in args.prompts:
            if args.stream:
                for delta in client.stream(prompt, params):
                    print(delta.text if delta.text is not None else delta.token_ids, end="", flush=True)
                print()
            else:
                out = client.generate(prompt, params)
                print(out.text if out.text is not None else out.token_ids)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="stepserve", description="stepserve LLM inference server")
    sub = parser.add_subparsers(dest="command", required=True)

    up = sub.add_parser("up", help="start a scheduler and N workers here; Ctrl-C stops all")
    add_cluster_flags(up)
    up.add_argument("--frontend", default="tcp://127.0.0.1:5555")
    up.add_argument("--workers-address", default="tcp://127.0.0.1:5556")
    up.set_defaults(func=cmd_up)

    gen = sub.add_parser("generate", help="complete prompts, on a running service or a local one")
    add_cluster_flags(gen)
    gen.add_argument("prompts", nargs="+")
    gen.add_argument("--address", default=None, help="a running scheduler's frontend; else start one")
    gen.add_argument("--max-tokens", type=int, default=32)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--ignore-eos", action="store_true")
    gen.add_argument("--stream", action="store_true")
    gen.set_defaults(func=cmd_generate)

    bench = sub.add_parser("bench", help="benchmarks")
    bench_sub = bench.add_subparsers(dest="bench", required=True)
    from benchmarks.throughput import add_throughput_args, run_throughput
    throughput = bench_sub.add_parser("throughput", help="offline throughput, like `vllm bench throughput`")
    add_cluster_flags(throughput)
    add_throughput_args(throughput)
    throughput.set_defaults(func=lambda a: asyncio.run(run_throughput(a)))

    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
