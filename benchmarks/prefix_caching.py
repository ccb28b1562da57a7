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
import copy
import statistics
import sys

from benchmarks.cpu_info import cpu_summary
from benchmarks.mode_runs import measure_on_fresh_cluster, mode_parser, run_mode_benchmark, run_rounds

MODES = {"on": "--enable-prefix-caching", "off": "--no-enable-prefix-caching"}


async def run_once(args: argparse.Namespace, workload: str, mode: str) -> dict:
    run_args = copy.copy(args)
    run_args.prefix_len = args.prefix_len if workload == "shared" else 0
    run_args.enable_prefix_caching = None  # the mode's flag below decides
    result = await measure_on_fresh_cluster(run_args, [MODES[mode]])
    return {"workload": workload, "prefix_caching": mode, **result}


async def run(args: argparse.Namespace) -> dict:
    cpu = cpu_summary()
    rows = []
    for workload in args.workloads.split(","):  # alternating within every round: on, off, on, off, ...
        rows += await run_rounds(
            args, list(MODES), lambda mode, workload=workload: run_once(args, workload, mode),
            lambda row: (f"{row['workload']:>8} round {row['round']} caching {row['prefix_caching']:>3}: "
                         f"{row['requests_per_second']:9.2f} requests/s ({row['elapsed_s']} s, "
                         f"{row['prefix_cache_hits']} of {row['prefix_cache_queries']} tokens found cached)"),
            mirror_odd_rounds=False)
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
    return summary


def main(argv=None) -> int:
    parser = mode_parser("python -m benchmarks.prefix_caching", __doc__, "on/off pairs per workload")
    parser.set_defaults(num_prompts=2000, prefix_len=1024, input_len=32, output_len=16)
    parser.add_argument("--workloads", default="shared,unshared")
    return run_mode_benchmark(parser, run, argv)


if __name__ == "__main__":
    sys.exit(main())
