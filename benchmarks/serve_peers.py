"""`vllm bench serve` against `stepserve serve`, `vllm serve` and llama.cpp's `llama-server`, side by
side in one script, on the same Hugging Face folder (llama.cpp: its GGUF conversions), engines
alternating (A B C, then C B A).

    python -m benchmarks.serve_peers --model models/tiny-llama --vllm-python VENV/bin/python \\
        --case 1:64 --case 16:512 --case 256:2000 --sampling default --sampling greedy --rounds 2 --json
    python -m benchmarks.serve_peers --model models/qwen3-0.6b --vllm-python VENV/bin/python \\
        --llama-server BUILD/bin/llama-server --gguf bf16=qwen3-bf16.gguf --gguf q8_0=qwen3-q8_0.gguf \\
        --input-len 128 --output-len 64 --case 1:8 --case 32:64 --sampling greedy

Each round starts each engine's server afresh, each with its own defaults (--stepserve-arg and
--vllm-arg add flags), warms it with an untimed run (twice the highest concurrency's prompts at
that concurrency: both engines compile for new batch shapes on first sight), and runs every case
(CONCURRENCY:NUM_PROMPTS) in every sampling against it with vLLM's benchmark client: its random
dataset, --input-len tokens in and --output-len out, streamed completions, EOS ignored. The
warm-up and each case draw prompts of their own (seeds apart; the client's own warm-up, which
sends a run's first prompt, is off): every engine caches prefixes, and a prompt seen before is
prefilled from its cache. Sampling `default` sends no temperature, so each server's
default (1.0); `greedy` sends temperature 0. vLLM's CLI runs through benchmarks/vllm_cli.py, and
its server with tcmalloc and Intel OpenMP preloaded when found and a KV cache of
--vllm-kv-cache-gb, as its docs recommend for CPUs. llama-server (--llama-server, one engine per
--gguf NAME=FILE, named llama.cpp-NAME: the folder converted, at the bits NAME says) gets every
core's threads, a slot per request of the highest concurrency, each slot the context of one
request, and continuous batching (../shared/peers/llamacpp/README.md, built from the sdist there).

Without --vllm-python, `stepserve bench serve` (the same metrics, its own client: what the test
does) measures stepserve and the llama.cpp engines: where vLLM's CPU wheel does not run (0.32's
needs AVX-512: on an AVX2 CPU its client and server die of an illegal instruction). It sends
token ids and counts each response's tokens from the server's usage. Besides the client's figures, every run records
the CPU seconds each server process used (scheduler, workers, gateway: where a request's cost
goes). Prints one JSON line per run and a summary with medians and, against each other engine,
the ratio of requests/s and whether stepserve's TTFT p50 and p99 and TPOT p50 are at or below
its; with the CPU named.
"""
import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator

import numpy as np

from benchmarks.cpu_info import cpu_summary
from benchmarks.peers import vllm_preload

METRICS = ("request_throughput", "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms", "median_itl_ms",
           "p99_itl_ms", "median_e2el_ms", "p99_e2el_ms")
# stepserve's figure must be at or below vLLM's for each of these.
LATENCY_TARGETS = ("median_ttft_ms", "p99_ttft_ms", "median_tpot_ms")
_VLLM_CLI = os.path.join(os.path.dirname(__file__), "vllm_cli.py")
LLAMA_CPP = "llama.cpp-"  # the engines of --gguf NAME=FILE: llama.cpp-NAME
WARM_UP_SEED_OFFSET = 1_000_003  # the warm-up's prompts, apart from every case's (--seed + its index)


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _await_ready(proc: subprocess.Popen, base_url: str, timeout_s: float, log_path: str) -> None:
    """Until the server lists its model (stepserve: a worker has joined; vLLM: the engine is up)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited ({proc.returncode}):\n{_tail(log_path)}")
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(base_url + "/v1/models", timeout=5) as response:
                if response.status == 200:
                    return
        time.sleep(0.5)
    raise RuntimeError(f"the server was not ready in {timeout_s:.0f} s:\n{_tail(log_path)}")


def _tail(path: str, num_chars: int = 3000) -> str:
    with open(path, errors="replace") as f:
        return f.read()[-num_chars:]


@contextlib.contextmanager
def running_server(cmd: list[str], env: dict, port: int, log_path: str, timeout_s: float) -> Iterator[int]:
    """The server in a session of its own; yields its pid. Stopped with Ctrl-C (SIGINT), then
    anything of its process tree still running is killed."""
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        _await_ready(proc, f"http://127.0.0.1:{port}", timeout_s, log_path)
        yield proc.pid
    finally:
        tree = _tree(_processes(), proc.pid)  # stepserve's processes have sessions of their own
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=60)
        for pid in tree:  # whatever it left behind
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.wait()


def _processes() -> dict[int, tuple[int, str, float]]:
    """Every process: pid -> (parent pid, role, CPU seconds so far, user + system); the role is the
    module a python process runs (`-m worker_svc`), else its command name."""
    ticks = os.sysconf("SC_CLK_TCK")
    table = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError, ValueError):
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().decode(errors="replace").split("\0")
            fields = stat[stat.rindex(")") + 2:].split()
            role = argv[argv.index("-m") + 1] if "-m" in argv[:-1] else stat[stat.index("(") + 1:stat.rindex(")")]
            table[int(pid)] = (int(fields[1]), role, (int(fields[11]) + int(fields[12])) / ticks)
    return table


def _tree(table: dict[int, tuple[int, str, float]], root: int) -> list[int]:
    """root and every process it started (and they started) that is still running."""
    children: dict[int, list[int]] = {}
    for pid, (parent, _, _) in table.items():
        children.setdefault(parent, []).append(pid)
    tree, stack = [], [root]
    while stack:
        pid = stack.pop()
        stack += children.get(pid, [])
        tree.append(pid)
    return tree


def tree_cpu_seconds(root: int) -> dict[str, float]:
    """CPU seconds so far of the process `root` and everything it started, summed by role."""
    table = _processes()
    totals: dict[str, float] = {}
    for pid in _tree(table, root):
        if pid in table:
            role, seconds = table[pid][1], table[pid][2]
            totals[role] = totals.get(role, 0.0) + seconds
    return totals


def server_command(engine: str, args: argparse.Namespace, port: int) -> tuple[list[str], dict]:
    if engine == "stepserve":
        return ([sys.executable, "-m", "stepserve.cli", "serve", "--model", args.model, "--dtype", args.dtype,
                 "--port", str(port), "--served-model-name", args.served_model_name, *args.stepserve_arg],
                dict(os.environ))
    if engine.startswith(LLAMA_CPP):
        slots = max(concurrency for concurrency, _ in args.case)
        context = _request_context(args)
        threads = str(os.cpu_count() or 1)
        return ([args.llama_server, "-m", args.gguf[engine.removeprefix(LLAMA_CPP)], "--alias", args.served_model_name,
                 "--host", "127.0.0.1", "--port", str(port), "-t", threads, "-tb", threads, "-np", str(slots),
                 "-c", str(slots * context), "--cont-batching", "--cache-ram", "0", *args.llama_arg], dict(os.environ))
    env = dict(os.environ, VLLM_TARGET_DEVICE="cpu", LD_PRELOAD=vllm_preload(args.vllm_python),
               VLLM_CPU_KVCACHE_SPACE=str(args.vllm_kv_cache_gb))
    # the model's own max_model_len (40,960 for Qwen3) needs more KV cache than --vllm-kv-cache-gb holds,
    # and then vllm serve hangs at start rather than exiting
    max_model_len = [] if "--max-model-len" in args.vllm_arg else ["--max-model-len", str(_request_context(args))]
    return ([args.vllm_python, _VLLM_CLI, "serve", args.model, "--dtype", args.dtype, "--port", str(port),
             "--served-model-name", args.served_model_name, "--seed", str(args.seed), *max_model_len, *args.vllm_arg], env)


def _request_context(args: argparse.Namespace) -> int:
    """The tokens one request of the benchmark holds, with room for a chat template."""
    return args.request_len + 16


def client_command(args: argparse.Namespace, engine: str, port: int, concurrency: int, num_prompts: int,
                   sampling: str, seed: int, result_path: str) -> list[str]:
    """vLLM's `bench serve` when a vLLM environment is given, else `stepserve bench serve`."""
    greedy = ["--temperature", "0"] if sampling == "greedy" else []
    common = ["--num-prompts", str(num_prompts), "--max-concurrency", str(concurrency), "--seed", str(seed), *greedy]
    url = f"http://127.0.0.1:{port}"
    if args.vllm_python is None:
        return [sys.executable, "-m", "stepserve.cli", "bench", "serve", "--base-url", url,
                "--served-model-name", args.served_model_name, "--input-len", str(args.input_len),
                "--output-len", str(args.output_len), "--json", result_path, *common]
    # llama.cpp: the per-request times too, for its TPOT (run_client)
    detailed = ["--save-detailed"] if engine.startswith(LLAMA_CPP) else []
    dataset = ["--dataset-name", "random", "--random-input-len", str(args.input_len),
               "--random-output-len", str(args.output_len)]
    return vllm_bench_command(args, url, [*detailed, *dataset, *common], result_path)


def vllm_bench_command(args: argparse.Namespace, url: str, run_args: list[str], result_path: str) -> list[str]:
    """vLLM's `bench serve` of args.served_model_name at url, streamed, EOS ignored, its own warm-up
    off, its result saved to result_path; run_args: the dataset, the request count, the rest."""
    return [args.vllm_python, _VLLM_CLI, "bench", "serve", "--backend", "vllm", "--base-url", url,
            "--model", args.served_model_name, "--tokenizer", args.model, "--ignore-eos", "--disable-tqdm",
            "--num-warmups", "0", "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
            "--save-result", "--result-dir", os.path.dirname(result_path),
            "--result-filename", os.path.basename(result_path), *run_args]


def run_client(args: argparse.Namespace, engine: str, port: int, server_pid: int, concurrency: int,
               num_prompts: int, sampling: str, seed: int) -> dict:
    row, result = run_benchmark_client(
        lambda path: client_command(args, engine, port, concurrency, num_prompts, sampling, seed, path),
        server_pid, num_prompts, args.client_timeout)
    if result is not None and engine.startswith(LLAMA_CPP) and args.vllm_python is not None:
        row.update(_tpot_of_exact_outputs(result, args.output_len))
    return row


def run_benchmark_client(command, server_pid: int, num_prompts: int, timeout_s: float) -> tuple[dict, dict | None]:
    """Runs command(result_path) (a benchmark client); returns its METRICS row, with the CPU seconds
    the server's processes used meanwhile, and its whole result (None if it timed out)."""
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "result.json")
        before = tree_cpu_seconds(server_pid)
        try:
            out = subprocess.run(command(path), capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return ({"completed": 0, "failed": num_prompts, "timed_out": True, **dict.fromkeys(METRICS, float("nan")),
                     "cpu_s": {}}, None)
        after = tree_cpu_seconds(server_pid)
        if not os.path.exists(path):
            raise RuntimeError(f"the benchmark client wrote no result ({out.returncode}):\n"
                               f"{(out.stdout + out.stderr)[-3000:]}")
        with open(path) as f:
            result = json.load(f)
    # vLLM's client reports the requests that failed but still exits 0; ours exits 1.
    row = {key: result[key] for key in ("completed", "failed", *METRICS)}
    row["cpu_s"] = {role: round(seconds - before.get(role, 0.0), 2) for role, seconds in after.items()}
    return row, result


def _tpot_of_exact_outputs(result: dict, output_len: int) -> dict:
    """TPOT p50 and p99 over the requests, each of exactly output_len tokens (EOS ignored). vLLM's
    client counts a response's tokens by tokenizing its text again, and llama-server writes the
    random models' tokens past the byte range as `<extra_N>`, which the folder's tokenizer reads as
    a dozen tokens each: its own TPOT for llama.cpp came out at 2.3 ms where the ITL was 31."""
    tpots = [(latency - ttft) / (output_len - 1) * 1e3
             for latency, ttft in zip(result["latencies"], result["ttfts"]) if latency > 0]
    if output_len < 2 or not tpots:
        return {}
    return {"median_tpot_ms": float(np.median(tpots)), "p99_tpot_ms": float(np.percentile(tpots, 99))}


def summarize(runs: list[dict]) -> list[dict]:
    """Medians per (concurrency, sampling, engine), and stepserve against each other engine that ran."""
    groups: dict[tuple, dict[str, list[dict]]] = {}
    for run in runs:
        groups.setdefault((run["concurrency"], run["sampling"]), {}).setdefault(run["engine"], []).append(run)
    summary = []
    for (concurrency, sampling), engines in groups.items():
        row: dict = {"concurrency": concurrency, "sampling": sampling}
        for engine, engine_runs in engines.items():
            row[engine] = {key: round(statistics.median(r[key] for r in engine_runs), 2) for key in METRICS}
            row[engine]["failed"] = sum(r["failed"] for r in engine_runs)
        others = [engine for engine in engines if engine != "stepserve"]
        if "stepserve" in engines and others:
            ours = row["stepserve"]
            row["vs"] = {engine: {"ratio": round(ours["request_throughput"] / row[engine]["request_throughput"], 2),
                                  "latency_at_or_below": {key: ours[key] <= row[engine][key] for key in LATENCY_TARGETS}}
                         for engine in others}
        summary.append(row)
    return summary


def engine_summaries(row: dict, extra=lambda metrics: "") -> list[str]:
    """A summary row's engines, one printable part each; extra(metrics) goes before the failures."""
    return [f"{engine} {m['request_throughput']:.2f} req/s, TTFT p50/p99 {m['median_ttft_ms']:.0f}/"
            f"{m['p99_ttft_ms']:.0f} ms, TPOT p50/p99 {m['median_tpot_ms']:.1f}/{m['p99_tpot_ms']:.1f} ms, "
            f"{extra(m)}{m['failed']} failed;"
            for engine, m in row.items() if isinstance(m, dict) and "request_throughput" in m]


def _line(row: dict) -> str:
    parts = [f"c={row['concurrency']} {row['sampling']}:", *engine_summaries(row)]
    for engine, versus in row.get("vs", {}).items():
        parts.append(f"{versus['ratio']:.2f}x {engine};")
    return " ".join(parts)


def add_server_args(p: argparse.ArgumentParser, vllm_python_help: str, client_timeout_s: float = 900.0) -> None:
    """The flags of every benchmark here that starts the servers and runs `vllm bench serve` on them."""
    p.add_argument("--model", required=True, help="a Hugging Face folder (with its tokenizer, for vLLM's client)")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--served-model-name", default=None, help="default: the folder's name")
    p.add_argument("--vllm-python", default=None, help=vllm_python_help)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--stepserve-arg", action="append", default=[], help="extra flag for every `stepserve serve`")
    p.add_argument("--vllm-arg", action="append", default=[], help="extra flag for `vllm serve`")
    p.add_argument("--vllm-kv-cache-gb", type=int, default=2,
                   help="VLLM_CPU_KVCACHE_SPACE for vllm serve: left unset, vllm-cpu 0.32 sized its KV cache to "
                        "nearly all of a 24 GB host's memory and thrashed at concurrency 256")
    p.add_argument("--start-timeout", type=float, default=900.0, help="seconds a server may take to start")
    p.add_argument("--client-timeout", type=float, default=client_timeout_s,
                   help="seconds one benchmark run may take; past it, its requests count as failed")
    p.add_argument("--log-dir", default=None, help="where the servers' logs go (default: a temporary folder)")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON line")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.serve_peers", description=__doc__.splitlines()[0])
    add_server_args(p, vllm_python_help="python of a venv with vllm-cpu; without it, stepserve only")
    p.add_argument("--llama-server", default=None, help="llama.cpp's llama-server binary, for the --gguf engines")
    p.add_argument("--gguf", action="append", default=[], metavar="NAME=FILE",
                   help="repeatable: the model as GGUF (e.g. bf16=m-bf16.gguf), served as engine llama.cpp-NAME")
    p.add_argument("--engine", action="append", default=None,
                   help="repeatable: stepserve, vllm, llama.cpp-NAME (default: stepserve, vllm with --vllm-python, "
                        "and every --gguf)")
    p.add_argument("--case", action="append", default=None, metavar="CONCURRENCY:NUM_PROMPTS",
                   help="repeatable (default: 1:64, 16:512, 256:2000)")
    p.add_argument("--sampling", action="append", choices=("default", "greedy"), default=None,
                   help="repeatable (default: both)")
    p.add_argument("--input-len", type=int, default=16)
    p.add_argument("--output-len", type=int, default=16)
    p.add_argument("--llama-arg", action="append", default=[], help="extra flag for `llama-server`")
    args = p.parse_args(argv)
    args.served_model_name = args.served_model_name or os.path.basename(args.model.rstrip("/"))
    args.request_len = args.input_len + args.output_len
    args.case = [tuple(int(x) for x in case.split(":")) for case in args.case or ("1:64", "16:512", "256:2000")]
    args.sampling = args.sampling or ["default", "greedy"]
    args.gguf = dict(spec.split("=", 1) for spec in args.gguf)
    llama_engines = [LLAMA_CPP + name for name in args.gguf]
    args.engine = args.engine or ["stepserve", *(["vllm"] if args.vllm_python else []), *llama_engines]
    for engine in args.engine:
        if engine not in ("stepserve", "vllm", *llama_engines):
            p.error(f"--engine {engine}: one of stepserve, vllm, or llama.cpp-NAME of a --gguf NAME=FILE")
    if "vllm" in args.engine and not args.vllm_python:
        p.error("--engine vllm needs --vllm-python")
    if llama_engines and not args.llama_server:
        p.error("--gguf needs --llama-server")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the servers on the way out
    engines = args.engine
    cpu = cpu_summary()
    print(f"cpu: {cpu}", flush=True)
    log_dir = args.log_dir or tempfile.mkdtemp(prefix="serve-peers-")
    os.makedirs(log_dir, exist_ok=True)
    runs = []
    for round_index in range(args.rounds):
        for engine in engines if round_index % 2 == 0 else engines[::-1]:
            port = _free_port()
            cmd, env = server_command(engine, args, port)
            log_path = os.path.join(log_dir, f"{engine}-{round_index}.log")
            with running_server(cmd, env, port, log_path, args.start_timeout) as server_pid:
                # Untimed: what a server does once (compiling for new batch shapes) is not its speed. Its
                # prompts, and each case's, are drawn apart: a prompt seen before is a prefix-cache hit.
                busiest = max(concurrency for concurrency, _ in args.case)
                run_client(args, engine, port, server_pid, busiest, 2 * busiest, args.sampling[0],
                           args.seed + WARM_UP_SEED_OFFSET)
                for case_index, (concurrency, num_prompts) in enumerate(args.case):
                    for sampling_index, sampling in enumerate(args.sampling):
                        seed = args.seed + case_index * len(args.sampling) + sampling_index
                        run = {"round": round_index, "engine": engine, "concurrency": concurrency,
                               "num_prompts": num_prompts, "sampling": sampling,
                               **run_client(args, engine, port, server_pid, concurrency, num_prompts, sampling,
                                            seed)}
                        runs.append(run)
                        print(json.dumps(run), flush=True)
    return report(args, cpu, runs, summarize(runs), _line, input_len=args.input_len, output_len=args.output_len)


def report(args: argparse.Namespace, cpu: str, runs: list[dict], summary: list[dict], line, **workload) -> int:
    """Prints the summary's rows, and with --json the whole as one line; 0 if no request failed."""
    for row in summary:
        print(line(row), flush=True)
    if args.json:
        print(json.dumps({"cpu": cpu, "model": args.served_model_name, "dtype": args.dtype, **workload,
                          "cases": summary}))
    return 0 if all(run["failed"] == 0 for run in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
