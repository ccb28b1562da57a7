"""A flood of prompts through the SDK's window: every one completes, the scheduler's memory stays
bounded by --max-queued-requests whatever the number of prompts. Prints the scheduler's peak RSS.

    python -m benchmarks.flood --num-prompts 1000000      # micro-llama, 4-token prompts, 1 token out
"""
import argparse
import asyncio
import json
import random
import time

from client_sdk import AsyncClient, SamplingParams
from stepserve.launcher import LocalCluster


def rss_mb(pid: int, field: str = "VmHWM") -> float:
    """VmHWM: the peak resident set; VmRSS: now. In MiB, from /proc."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise KeyError(field)


async def flood(cluster: LocalCluster, num_prompts: int, prompt_len: int, window: int | None) -> dict:
    prompts = [[random.randrange(4, 1000) for _ in range(prompt_len)] for _ in range(num_prompts)]
    params = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=1)
    async with AsyncClient(cluster.address, timeout_s=60) as client:
        await client.wait_for_workers(cluster.num_worker_processes)
        rss_before = rss_mb(cluster.scheduler.pid, "VmRSS")
        start = time.monotonic()
        outputs = await client.generate_batch(prompts, params, window=window)
        wall_s = time.monotonic() - start
        health = await client.health()
    return {"num_prompts": num_prompts, "num_completed": sum(o.ok for o in outputs),
            "errors": sorted({o.error_code for o in outputs if not o.ok}), "wall_s": round(wall_s, 1),
            "requests_per_s": round(num_prompts / wall_s, 1), "scheduler_rss_before_mb": round(rss_before, 1),
            "scheduler_peak_rss_mb": round(rss_mb(cluster.scheduler.pid), 1), "num_finished": health.num_finished}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--num-prompts", type=int, default=1_000_000)
    p.add_argument("--prompt-len", type=int, default=4)
    p.add_argument("--max-queued-requests", type=int, default=None, help="the scheduler's (default: its own)")
    p.add_argument("--window", type=int, default=None, help="the SDK's (default: half the scheduler's limit)")
    p.add_argument("--max-num-seqs", type=int, default=512)
    args = p.parse_args()
    scheduler_args = ["--max-num-seqs", str(args.max_num_seqs)]
    if args.max_queued_requests:
        scheduler_args += ["--max-queued-requests", str(args.max_queued_requests)]
    with LocalCluster("micro-llama", 1, scheduler_args=scheduler_args,
                      worker_args=["--dtype", "float32", "--kv-cache-gb", "0.2"]) as cluster:
        result = asyncio.run(flood(cluster, args.num_prompts, args.prompt_len, args.window))
    print(json.dumps({"config": vars(args), **result}))


if __name__ == "__main__":
    main()
