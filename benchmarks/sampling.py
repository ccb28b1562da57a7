"""Sampled against greedy throughput, in one script: greedy, temperature 1.0 (what the `openai`
client and `vllm bench serve` get when they send none) and temperature 0.8 + top-p 0.95 +
top-k 50, alternating (A B C, C B A, ...), medians, each sampled mode's requests/s over greedy's.
Each run starts its own local cluster and measures like `stepserve bench throughput` (random
prompt ids, exactly --output-len new tokens, every prompt at once, generation timed); sampled
requests carry seeds (--seed + index), which cost the same as unseeded ones.

    python -m benchmarks.sampling --model tiny-llama --num-prompts 3000 --rounds 2 --json
"""
import argparse
import copy
import sys

from benchmarks.cpu_info import cpu_summary
from benchmarks.mode_runs import (measure_on_fresh_cluster, medians_by_mode, mode_parser, run_mode_benchmark,
                                  run_rounds)

MODES = {"greedy": dict(temperature=0.0),
         "temperature_1": dict(temperature=1.0),
         "top_p_top_k": dict(temperature=0.8, top_p=0.95, top_k=50)}


async def run_once(args: argparse.Namespace, mode: str) -> dict:
    run_args = copy.copy(args)
    vars(run_args).update(MODES[mode])
    return {"sampling_mode": mode, **await measure_on_fresh_cluster(run_args)}


async def run(args: argparse.Namespace) -> dict:
    cpu = cpu_summary()
    modes = tuple(MODES)
    rows = await run_rounds(
        args, modes, lambda mode: run_once(args, mode),
        lambda row: (f"round {row['round']} {row['sampling_mode']:>13}: {row['requests_per_second']:9.2f} "
                     f"requests/s, step {row['mean_step_time_ms']:.2f} ms"),
        mirror_odd_rounds=True)
    medians = medians_by_mode(rows, "sampling_mode", modes, ("requests_per_second", "mean_step_time_ms"))
    greedy = medians["greedy"]["requests_per_second"]
    summary = {"cpu": cpu, "model": args.model, "num_prompts": args.num_prompts, "rounds": args.rounds,
               **medians, **{f"{m}_over_greedy": round(medians[m]["requests_per_second"] / greedy, 3)
                             for m in modes[1:]}}
    print(f"{args.model}: " + ", ".join(f"{m} {medians[m]['requests_per_second']:.1f}" for m in modes)
          + " requests/s (medians of {}); sampled over greedy ".format(args.rounds)
          + " / ".join(str(summary[f"{m}_over_greedy"]) for m in modes[1:]) + f"   [{cpu}]")
    return summary


def main(argv=None) -> int:
    parser = mode_parser("python -m benchmarks.sampling", __doc__, "rounds of the three modes")
    parser.set_defaults(model="tiny-llama", num_prompts=3000, rounds=2)
    return run_mode_benchmark(parser, run, argv)


if __name__ == "__main__":
    sys.exit(main())
