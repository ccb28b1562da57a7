"""The checks of a lent GPU machine, in one call (benchmarks/gpu_check.sh runs it there):

    python -m benchmarks.gpu_check --out DIR [--device cuda] [--parts exactness,throughput,runner_step,replicas]

Each result is one JSON line on stdout, appended to DIR/results.jsonl as it comes (a run cut
short keeps what it finished), with "check" naming the part:
- device: the GPU (or CPU), torch, triton;
- exactness: greedy tokens of Llama, OPT, Qwen2 and Jamba folders made with transformers, through
  a real scheduler and worker, equal to transformers' generate on the same device, per dtype and
  mode (eager, compiled without CUDA graphs, graphs: the default); float32 is judged ("equal")
  in every mode, bfloat16 reported in --bf16-modes (graphs: the serving path); Jamba runs
  eagerly whatever the mode, so only its eager mode runs;
- throughput: `stepserve bench throughput` (the CLI, on a cluster of --bench-model) at each
  --num-prompts, 16 in / 16 out, bfloat16, async scheduling on and off; then throughput_ratio
  (the largest over the smallest count, per setting), async_ratio (on over off, per count) and
  busy (the worker's busy fraction and mean step at the fullest batch, from the largest run);
- runner_step: benchmarks/runner_step.py, the per-step time split, per mode;
- replicas: two workers on the one device as two data-parallel replicas, each with half the
  memory (--gpu-memory-utilization), against the one-replica run of the same size.
Exit status 1 if any line has an error or a judged result is not equal.
--deadline-s bounds the whole: a part or a bench run that would start past it says "skipped"
instead, and every child has a timeout. The
smoke test (tests/e2e/test_gpu_check.py) runs it on CPU at tiny sizes.
"""
import argparse
import concurrent.futures
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time

import torch

from client_sdk.sync_client import Client
from protocol.sampling import SamplingParams
from stepserve.launcher import LocalCluster, ProcessExited

FAMILIES = ("llama", "opt", "qwen2", "jamba")
MODES = {"eager": ["--enforce-eager"], "compiled": ["--max-cudagraph-capture-size", "0"], "graphs": []}
PROMPT_LENS = (3, 17, 9, 40, 5, 12, 30, 8, 21, 2, 14, 33)  # 12 prompts: decode batches of 8 and 16
NUM_NEW_TOKENS = 16
CAPTURED = re.compile(r"captured (\d+) CUDA graphs")


class Report:
    """Prints each result as a JSON line and appends it to DIR/results.jsonl."""

    def __init__(self, out_dir: str):
        os.makedirs(out_dir, exist_ok=True)
        self.path = os.path.join(out_dir, "results.jsonl")
        self.start = time.monotonic()
        self.failed = False  # an error, or a judged result not equal

    def __call__(self, check: str, **fields) -> dict:
        self.failed |= "error" in fields or (fields.get("judged", False) and not fields.get("equal"))
        line = {"check": check, **fields, "at_s": round(time.monotonic() - self.start, 1)}
        text = json.dumps(line)
        print(text, flush=True)
        with open(self.path, "a") as f:
            f.write(text + "\n")
        return line


def device_line(args) -> dict:
    fields = {"device": args.device, "torch": torch.__version__}
    if args.device.startswith("cuda"):
        fields.update(name=torch.cuda.get_device_name(args.device), cuda=torch.version.cuda,
                      memory_gb=round(torch.cuda.get_device_properties(args.device).total_memory / 2**30, 1))
        try:
            import triton
            fields["triton"] = triton.__version__
        except ImportError:
            fields["triton"] = None
    else:
        fields["cpus"] = os.cpu_count()
    return fields


@contextlib.contextmanager
def started(cluster: LocalCluster, args):
    """The cluster started within --child-timeout-s, stopped on leaving (a failed start too);
    killed if not gone in 2 s (its results are in: a graceful drain would only cost time)."""
    try:
        yield cluster.start(timeout_s=args.child_timeout_s)
    finally:
        cluster.stop(timeout_s=2.0)


def worker_log(cluster: LocalCluster) -> str:
    log = cluster.worker_procs[0].stderr_file
    log.seek(0)
    return log.read().decode(errors="replace")


# ---- exactness -------------------------------------------------------------------------------

def make_folders(families, root: str) -> dict[str, str]:
    from tests.hf_model_folders import make_llama_folder, make_opt_folder, make_qwen2_folder
    from tests.mamba_model_folders import make_jamba_folder
    makers = {"llama": make_llama_folder, "opt": make_opt_folder, "qwen2": make_qwen2_folder,
              "jamba": make_jamba_folder}
    folders = {family: os.path.join(root, family) for family in families}
    for family, folder in folders.items():
        makers[family](folder)  # the Jamba maker returns its model, the others the folder
    return folders


def prompts_for(vocab_size: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(1)
    return [torch.randint(4, vocab_size, (n,), generator=generator).tolist() for n in PROMPT_LENS]


def hf_greedy(folder: str, prompts, dtype: torch.dtype, device: str) -> list[list[int]]:
    """transformers' greedy tokens, one prompt at a time (no padding), on `device`."""
    import transformers
    # transformers before 4.56 names it torch_dtype (and would ignore dtype)
    dtype_key = "dtype" if tuple(map(int, transformers.__version__.split(".")[:2])) >= (4, 56) else "torch_dtype"
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, **{dtype_key: dtype}).to(device).eval()
    outputs = []
    with torch.inference_mode():
        for prompt in prompts:
            ids = model.generate(torch.tensor([prompt], device=device), max_new_tokens=NUM_NEW_TOKENS,
                                 min_new_tokens=NUM_NEW_TOKENS, do_sample=False)
            outputs.append(ids[0, len(prompt):].tolist())
    del model
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return outputs


def our_greedy(folder: str, prompts, dtype: str, mode: str, args) -> tuple[list[list[int]], int, list[str]]:
    """Our greedy tokens through a scheduler and a worker; the CUDA graphs it captured, and the
    warnings and errors of its log (a capture that failed, triton missing, ...)."""
    worker_args = ["--device", args.device, "--dtype", dtype, *MODES[mode], *args.small_memory, *args.cache]
    with started(LocalCluster(folder, worker_args=worker_args), args) as cluster:
        client = Client(cluster.address)
        try:
            params = SamplingParams(temperature=0.0, max_tokens=NUM_NEW_TOKENS, min_tokens=NUM_NEW_TOKENS)
            outputs = client.generate_batch(prompts, params)
        finally:
            client.close()
        log = worker_log(cluster)
    found = CAPTURED.search(log)
    notes = [line[-300:] for line in log.splitlines() if " WARNING " in line or " ERROR " in line][-5:]
    return [o.outputs[0].token_ids for o in outputs], int(found.group(1)) if found else 0, notes


def check_exactness(report: Report, args) -> None:
    folders = make_folders(args.families, tempfile.mkdtemp(prefix="gpu-check-models-"))
    runs = []  # (family, dtype, mode, prompts, expected)
    for family, folder in folders.items():
        with open(os.path.join(folder, "config.json")) as f:
            prompts = prompts_for(json.load(f)["vocab_size"])
        for dtype in args.dtypes:
            modes = args.modes if dtype == "float32" else [m for m in args.modes if m in args.bf16_modes]
            modes = ["eager"] if family == "jamba" else modes
            if modes:
                expected = hf_greedy(folder, prompts, getattr(torch, dtype), args.device)
                runs += [(family, dtype, mode, prompts, expected) for mode in modes]

    def run(family, dtype, mode, prompts, expected):
        start = time.monotonic()
        try:
            got, num_graphs, notes = our_greedy(folders[family], prompts, dtype, mode, args)
        except Exception as exc:  # noqa: BLE001 - reported as this run's result; the others go on
            return dict(family=family, dtype=dtype, mode=mode, error=f"{type(exc).__name__}: {exc}",
                        log_tail=getattr(exc, "log", "")[-2000:])
        mismatches = [i for i, (a, b) in enumerate(zip(got, expected)) if a != b]
        return dict(family=family, dtype=dtype, mode=mode, judged=dtype == "float32",
                    equal=not mismatches, num_prompts=len(prompts), mismatched_prompts=mismatches,
                    first_mismatch=(got[mismatches[0]], expected[mismatches[0]]) if mismatches else None,
                    graphs_captured=num_graphs, worker_notes=notes, seconds=round(time.monotonic() - start, 1))

    with concurrent.futures.ThreadPoolExecutor(args.parallel) as pool:
        for result in pool.map(lambda r: run(*r), runs):
            report("exactness", **result)


# ---- throughput, busy fraction, replicas ----------------------------------------------------

def bench_cluster(args, async_scheduling: bool | None, data_parallel_size: int = 1) -> LocalCluster:
    """A cluster of --bench-model in bfloat16, not started yet."""
    worker_args = ["--dtype", "bfloat16", *args.cache]
    if args.device != "cpu":
        worker_args += ["--device", args.device,
                        "--gpu-memory-utilization", str(round(args.gpu_memory_utilization / data_parallel_size, 3))]
    if args.bench_eager:
        worker_args.append("--enforce-eager")
    scheduler_args = [] if async_scheduling is None else \
        ["--async-scheduling" if async_scheduling else "--no-async-scheduling"]
    if args.max_num_seqs:
        scheduler_args += ["--max-num-seqs", str(args.max_num_seqs)]
    return LocalCluster(args.bench_model, data_parallel_size, worker_args=worker_args,
                        scheduler_args=scheduler_args)


def bench_throughput(address: str, num_prompts: int, timeout_s: float) -> dict:
    """`stepserve bench throughput` against a running cluster; its JSON line. The seed differs
    per count: the same seed would repeat the smaller run's prompts, found in the prefix cache."""
    command = [sys.executable, "-c", "import sys; from stepserve.cli import main; sys.exit(main())",
               "bench", "throughput", "--address", address, "--num-prompts", str(num_prompts),
               "--input-len", "16", "--output-len", "16", "--seed", str(num_prompts), "--json"]
    done = subprocess.run(command, capture_output=True, text=True, check=True, timeout=timeout_s)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result.pop("config", None)
    return result


def check_throughput(report: Report, args) -> dict:
    """The throughput lines; returns {(async, num_prompts): requests/s} for the ratios."""
    rates = {}
    for async_scheduling in (True, False):
        with started(bench_cluster(args, async_scheduling), args) as cluster:
            for num_prompts in args.num_prompts:
                if args.out_of_time():
                    report("throughput", async_scheduling=async_scheduling, num_prompts=num_prompts,
                           skipped=f"past --deadline-s {args.deadline_s}")
                    continue
                result = bench_throughput(cluster.address, num_prompts, args.child_timeout_s)
                rates[async_scheduling, num_prompts] = result
                report("throughput", async_scheduling=async_scheduling, **result)
    low, high = min(args.num_prompts), max(args.num_prompts)
    if len(rates) < 2 * len(args.num_prompts):
        return rates  # no ratios of runs that did not happen
    for async_scheduling in (True, False):
        report("throughput_ratio", async_scheduling=async_scheduling, num_prompts=(high, low),
               ratio=round(rates[async_scheduling, high]["requests_per_second"]
                           / rates[async_scheduling, low]["requests_per_second"], 3))
        busiest = rates[async_scheduling, high]
        report("busy", async_scheduling=async_scheduling, num_prompts=high,
               worker_busy_fraction=busiest["worker_busy_fraction"],
               mean_step_time_ms=busiest["mean_step_time_ms"])
    for num_prompts in args.num_prompts:
        report("async_ratio", num_prompts=num_prompts,
               ratio=round(rates[True, num_prompts]["requests_per_second"]
                           / rates[False, num_prompts]["requests_per_second"], 3))
    return rates


def check_replicas(report: Report, args, rates: dict) -> None:
    num_prompts = min(args.num_prompts)
    one = rates.get((True, num_prompts))
    with started(bench_cluster(args, True, data_parallel_size=2), args) as cluster:
        two = bench_throughput(cluster.address, num_prompts, args.child_timeout_s)
    report("replicas", replicas=2, num_prompts=num_prompts, requests_per_second=two["requests_per_second"],
           one_replica_requests_per_second=one and one["requests_per_second"],
           ratio=one and round(two["requests_per_second"] / one["requests_per_second"], 3))


def check_runner_step(report: Report, args) -> None:
    command = [sys.executable, "-m", "benchmarks.runner_step", "--model", args.bench_model, "--device", args.device,
               "--dtype", "bfloat16", "--batch", str(args.step_batch), "--prompt-len", "16",
               "--steps", str(args.step_count), "--modes", ",".join(args.modes), *args.cache, "--json"]
    done = subprocess.run(command, capture_output=True, text=True, check=True, timeout=args.child_timeout_s)
    report("runner_step", **json.loads(done.stdout.strip().splitlines()[-1]))


# ---- main ------------------------------------------------------------------------------------

def parse_args(argv=None) -> argparse.Namespace:
    def csv(kind=str):
        return lambda text: [kind(x) for x in text.split(",") if x]
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="folder for results.jsonl")
    p.add_argument("--device", default="cuda:0", help="cuda:N or cpu")
    p.add_argument("--parts", type=csv(), default=["exactness", "throughput", "runner_step", "replicas"])
    p.add_argument("--families", type=csv(), default=list(FAMILIES))
    p.add_argument("--dtypes", type=csv(), default=["float32", "bfloat16"])
    p.add_argument("--modes", type=csv(), default=list(MODES))
    p.add_argument("--bf16-modes", type=csv(), default=["graphs"], help="the modes bfloat16 is reported in")
    p.add_argument("--parallel", type=int, default=6, help="exactness clusters at once")
    p.add_argument("--bench-model", default="opt-125m")
    p.add_argument("--bench-eager", action="store_true", help="the benchmark clusters run --enforce-eager")
    p.add_argument("--num-prompts", type=csv(int), default=[10_000, 100_000])
    p.add_argument("--max-num-seqs", type=int, default=None, help="the scheduler's (default: its own)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9, help="a benchmark cluster's, split by replicas")
    p.add_argument("--step-batch", type=int, default=256, help="runner_step's batch")
    p.add_argument("--step-count", type=int, default=24, help="runner_step's timed steps")
    p.add_argument("--compile-cache-dir", default=None, help="every worker's (default: CUDA, a temporary one)")
    p.add_argument("--deadline-s", type=float, default=420.0, help="no part or bench run starts after this")
    p.add_argument("--child-timeout-s", type=float, default=300.0, help="of each cluster start and child command")
    args = p.parse_args(argv)
    start = time.monotonic()
    args.out_of_time = lambda: time.monotonic() - start > args.deadline_s
    # The exactness clusters run side by side: each takes a small share of the device.
    args.small_memory = [] if args.device == "cpu" else ["--gpu-memory-utilization", "0.04"]
    # On the GPU machine, compiled graphs go under the temporary folder (its home may not be
    # writable); on CPU the default cache keeps the C++ kernel already built there.
    if args.compile_cache_dir is None and args.device != "cpu":
        args.compile_cache_dir = os.path.join(tempfile.gettempdir(), "stepserve-gpu-check-cache")
    args.cache = ["--compile-cache-dir", args.compile_cache_dir] if args.compile_cache_dir else []
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    report = Report(args.out)
    report("device", **device_line(args))
    rates = {}
    for part in args.parts:
        if args.out_of_time():
            report(part, skipped=f"past --deadline-s {args.deadline_s}")
            continue
        try:
            if part == "exactness":
                check_exactness(report, args)
            elif part == "throughput":
                rates = check_throughput(report, args)
            elif part == "runner_step":
                check_runner_step(report, args)
            elif part == "replicas":
                check_replicas(report, args, rates)
            else:
                raise ValueError(f"no part {part!r}")
        except (ProcessExited, subprocess.SubprocessError, RuntimeError, ValueError, TimeoutError) as exc:
            detail = getattr(exc, "stderr", None) or getattr(exc, "log", "")
            report(part, error=f"{type(exc).__name__}: {exc}", log_tail=(detail or "")[-3000:])
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
