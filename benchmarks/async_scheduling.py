"""Async scheduling on vs off, in one script: modes alternate (async, sync, sync, async, ...),
medians. Each run starts its own local cluster and measures like `stepserve bench throughput`
(random prompt ids, exactly --output-len new tokens, greedy, every prompt handed over at once,
generation timed); it also reports the worker's busy fraction and mean step time, sampled from
health while the batch was at its fullest.

    python -m benchmarks.async_scheduling --model micro-llama --num-prompts 10000 --rounds 3 --json
    python -m benchmarks.async_scheduling --model tiny-llama --num-prompts 5000 --lock-file /tmp/cpu.lock
"""
import argparse
import copy
import sys

from benchmarks.cpu_info import cpu_summary
from benchmarks.mode_runs import measure_on_fresh_cluster, mode_parser, mode_summary, run_mode_benchmark, run_rounds

MODES = ("async", "sync")


async def run_once(args: argparse.Namespace, mode: str) -> dict:
    run_args = copy.copy(args)
    run_args.async_scheduling = mode == "async"
    result = await measure_on_fresh_cluster(run_args)
    return {"scheduling": mode, **result}


async def run(args: argparse.Namespace) -> dict:
    cpu = cpu_summary()
    rows = await run_rounds(
        args, MODES, lambda mode: run_once(args, mode),
        lambda row: (f"round {row['round']} {row['scheduling']:>5}: {row['requests_per_second']:9.2f} requests/s, "
                     f"step {row['mean_step_time_ms']:.2f} ms, worker busy {row['worker_busy_fraction']:.1%}"),
        mirror_odd_rounds=True)
    summary = mode_summary(args, cpu, rows, "scheduling", MODES,
                           ("requests_per_second", "mean_step_time_ms", "worker_busy_fraction"))
    print(f"{args.model}: async {summary['async']['requests_per_second']:.2f} / sync "
          f"{summary['sync']['requests_per_second']:.2f} requests/s (medians of {args.rounds}) = "
          f"{summary['async_over_sync']:.3f}x; worker busy {summary['async']['worker_busy_fraction']:.1%} / "
          f"{summary['sync']['worker_busy_fraction']:.1%}   [{cpu}]")
    return summary


def main(argv=None) -> int:
    parser = mode_parser("python -m benchmarks.async_scheduling", __doc__, "async/sync pairs")
    parser.set_defaults(model="micro-llama", num_prompts=10000)
    return run_mode_benchmark(parser, run, argv)


if __name__ == "__main__":
    sys.exit(main())
