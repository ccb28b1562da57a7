"""Batch jobs: `stepserve run-batch` memory and speed, and what a running batch costs an online
stream. One JSON line per measurement, the CPU named.

    python -m benchmarks.batch_jobs rss --sizes 100000,1000000       # peak RSS of run-batch and the scheduler
    python -m benchmarks.batch_jobs speed --num-prompts 20000 --rounds 2   # run-batch vs generate_batch
    python -m benchmarks.batch_jobs ttft --num-lines 100000 --seconds 30   # online TTFT with / without a batch

micro-llama, prompts of --prompt-len random token ids as /v1/completions lines, exactly
--max-tokens out, greedy. run-batch runs as its own process (`--address` to the cluster).
"""
import argparse
import asyncio
import gzip
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time

from benchmarks.cpu_info import cpu_summary
from benchmarks.flood import rss_mb
from client_sdk import AsyncClient, SamplingParams
from stepserve.launcher import LocalCluster


def write_input(path: str, num_lines: int, prompt_len: int, max_tokens: int, seed: int = 0) -> list[list[int]]:
    """A batch file of token-id completions; returns the prompts only when asked for few."""
    rng = random.Random(seed)
    prompts = []
    with gzip.open(path, "wt", compresslevel=1) as f:
        for i in range(num_lines):
            prompt = [rng.randrange(4, 1000) for _ in range(prompt_len)]
            if num_lines <= 200_000:
                prompts.append(prompt)
            body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
            f.write(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/completions", "body": body}))
            f.write("\n")
    return prompts


def start_run_batch(address: str, src: str, out: str, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "stepserve.cli", "run-batch", "--address", address, "-i", src,
                             "-o", out, *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_with_peak_rss(proc: subprocess.Popen) -> tuple[float, str]:
    """Waits for the process, reading its peak RSS (VmHWM) until it exits."""
    peak = 0.0
    while proc.poll() is None:
        try:
            peak = max(peak, rss_mb(proc.pid))
        except (OSError, KeyError):
            pass
        time.sleep(0.2)
    out, err = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"run-batch failed: {err[-2000:]}")
    return peak, out.strip()


def cluster_for(args) -> LocalCluster:
    scheduler = ["--max-num-seqs", str(args.max_num_seqs), "--scheduling-policy", "priority"]
    return LocalCluster("micro-llama", 1, scheduler_args=scheduler, worker_args=["--kv-cache-gb", "0.5"])


def measure_rss(args, tmp: str) -> None:
    for size in map(int, args.sizes.split(",")):
        src = os.path.join(tmp, f"in-{size}.jsonl.gz")
        write_input(src, size, args.prompt_len, args.max_tokens)
        with cluster_for(args) as cluster:
            start = time.monotonic()
            peak, summary = wait_with_peak_rss(start_run_batch(cluster.address, src, os.path.join(tmp, "out.jsonl")))
            wall_s = time.monotonic() - start
            scheduler_peak = rss_mb(cluster.scheduler.pid)
        print(json.dumps({"what": "rss", "num_lines": size, "run_batch_peak_rss_mb": round(peak, 1),
                          "scheduler_peak_rss_mb": round(scheduler_peak, 1), "wall_s": round(wall_s, 1),
                          "requests_per_s": round(size / wall_s, 1), "summary": summary, "cpu": cpu_summary(),
                          "config": vars(args)}), flush=True)
        os.remove(src)


async def _generate_batch(address: str, prompts, max_tokens: int) -> float:
    params = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=max_tokens)
    async with AsyncClient(address) as client:
        start = time.monotonic()
        outputs = await client.generate_batch(prompts, params)
        wall_s = time.monotonic() - start
    assert all(o.ok for o in outputs)
    return wall_s


def measure_speed(args, tmp: str) -> None:
    """Alternating, one cluster: run-batch (a process; the rate its summary line reports, from the
    job's start) against generate_batch on the same prompts in this process."""
    src = os.path.join(tmp, "in.jsonl.gz")
    prompts = write_input(src, args.num_prompts, args.prompt_len, args.max_tokens)
    runs = {"run_batch": [], "generate_batch": []}
    with cluster_for(args) as cluster:
        asyncio.run(_generate_batch(cluster.address, prompts[:500], args.max_tokens))  # warm-up
        for _ in range(args.rounds):
            _, summary = wait_with_peak_rss(start_run_batch(cluster.address, src, os.path.join(tmp, "out.jsonl")))
            # Its own rate, from the job's start to its end (the process's start-up and imports aside).
            runs["run_batch"].append(float(re.search(r"\(([\d.]+) requests/s", summary).group(1)))
            runs["generate_batch"].append(args.num_prompts / asyncio.run(
                _generate_batch(cluster.address, prompts, args.max_tokens)))
    medians = {mode: statistics.median(values) for mode, values in runs.items()}
    print(json.dumps({"what": "speed", "requests_per_s": {m: [round(v, 1) for v in vs] for m, vs in runs.items()},
                      "median": {m: round(v, 1) for m, v in medians.items()},
                      "ratio": round(medians["run_batch"] / medians["generate_batch"], 3), "cpu": cpu_summary(),
                      "config": vars(args)}), flush=True)


async def _online_ttfts(address: str, rate: float, seconds: float, prompt_len: int) -> tuple[list[float], float]:
    """TTFT of streams arriving at `rate` per second (Poisson) at priority 0, and the mean time
    of a step meanwhile (the scheduler's steps over the stream's wall time: a step's length when
    a batch keeps it busy, what a TTFT is made of)."""
    rng = random.Random(1)
    params = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=16)
    ttfts: list[float] = []

    async def one(prompt) -> None:
        start = time.monotonic()
        async for _ in client.stream(prompt, params, priority=0):
            ttfts.append(time.monotonic() - start)
            break

    async with AsyncClient(address) as client:
        num_steps, start = (await client.health()).num_steps, time.monotonic()
        tasks, end = [], start + seconds
        while time.monotonic() < end:
            tasks.append(asyncio.ensure_future(one([rng.randrange(4, 1000) for _ in range(prompt_len)])))
            await asyncio.sleep(rng.expovariate(rate))
        await asyncio.gather(*tasks)
        num_steps = (await client.health()).num_steps - num_steps
    return ttfts, (time.monotonic() - start) / max(num_steps, 1)


async def _until_idle(address: str) -> None:
    async with AsyncClient(address) as client:
        while (health := await client.health()).num_running + health.num_waiting:
            await asyncio.sleep(0.2)


def measure_ttft(args, tmp: str) -> None:
    src = os.path.join(tmp, "in.jsonl.gz")
    write_input(src, args.num_lines, args.prompt_len, args.max_tokens)
    result = {}
    with cluster_for(args) as cluster:
        asyncio.run(_online_ttfts(cluster.address, args.rate, 3, args.prompt_len))  # warm-up
        for mode in ("alone", "with_batch", "alone"):
            batch = start_run_batch(cluster.address, src, os.path.join(tmp, "out.jsonl")) \
                if mode == "with_batch" else None
            if batch is not None:  # measured once the batch is answering, so the scheduler is full of it
                out = os.path.join(tmp, "out.jsonl")
                while not (os.path.exists(out) and os.path.getsize(out)) and batch.poll() is None:
                    time.sleep(0.1)
                time.sleep(args.batch_head_start_s)
            ttfts, step_s = asyncio.run(_online_ttfts(cluster.address, args.rate, args.seconds, args.prompt_len))
            ttfts.sort()
            if batch is not None:
                still_running = batch.poll() is None
                batch.kill()
                batch.wait()
                assert still_running, "the batch ended before the online stream did: use more lines"
                asyncio.run(_until_idle(cluster.address))  # a killed client's requests still run
            result.setdefault(mode, []).append({"median_ms": round(1000 * statistics.median(ttfts), 1),
                                                "p99_ms": round(1000 * ttfts[int(0.99 * (len(ttfts) - 1))], 1),
                                                "num_requests": len(ttfts),
                                                "wall_per_step_ms": round(1000 * step_s, 1)})
    median_alone = statistics.median(r["median_ms"] for r in result["alone"])
    print(json.dumps({"what": "ttft", **result,
                      "median_ratio": round(result["with_batch"][0]["median_ms"] / median_alone, 2),
                      "cpu": cpu_summary(), "config": vars(args)}), flush=True)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=["rss", "speed", "ttft"])
    p.add_argument("--sizes", default="100000,1000000", help="rss: lines per run, a fresh cluster each")
    p.add_argument("--num-prompts", type=int, default=20000, help="speed: prompts")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--num-lines", type=int, default=100000, help="ttft: the batch's lines")
    p.add_argument("--rate", type=float, default=10.0, help="ttft: online requests per second")
    p.add_argument("--seconds", type=float, default=30.0, help="ttft: how long the online stream runs")
    p.add_argument("--batch-head-start-s", type=float, default=2.0, help="ttft: after the batch's first output")
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--max-num-seqs", type=int, default=256)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        {"rss": measure_rss, "speed": measure_speed, "ttft": measure_ttft}[args.what](args, tmp)


if __name__ == "__main__":
    main()
