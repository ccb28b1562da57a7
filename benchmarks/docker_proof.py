"""The operating promises on a real docker engine, with the real compose.yaml (opt-in, not CI).

Run as root from the project's root, after `../shared/tools/local-docker.sh` (engine + image):

    python -m benchmarks.docker_proof [--model micro-llama] [--num-prompts 2000]

1. `docker-compose up -d --scale worker=2`; an SDK client on the host (the frontend is published
   on 127.0.0.1:5555) waits for both workers.
2. `docker kill` of the scheduler container with a batch in flight, then `docker start`: the
   batch returns (lost requests fail with scheduler_restarted), and the time until both workers
   (never restarted) have joined again and a batch is served is measured; the promise is 10 s.
3. `docker-compose down` with a batch in flight: the batch returns every output (completed, or
   failed with shutting_down), none hanging; how long `down` took.
Prints one JSON line of figures.
"""
import argparse
import json
import random
import subprocess
import threading
import time

from client_sdk import Client, SamplingParams

ADDRESS = "tcp://127.0.0.1:5555"


def compose(*args: str, env: dict | None = None) -> str:
    out = subprocess.run(["docker-compose", *args], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr
    return out.stdout


def container_id(service: str) -> str:
    return compose("ps", "-q", service).split()[0]


def docker(*args: str) -> str:
    out = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def batch_in_thread(prompts, params) -> tuple[threading.Thread, list]:
    result: list = []

    def run():
        with Client(ADDRESS, timeout_s=60) as client:
            result.extend(client.generate_batch(prompts, params))
    thread = threading.Thread(target=run)
    thread.start()
    return thread, result


def error_counts(outputs) -> dict[str, int]:
    counts: dict[str, int] = {}
    for o in outputs:
        key = "completed" if o.ok else (o.error_code or "error")
        counts[key] = counts.get(key, 0) + 1
    return counts


def wait_finished(client: Client, at_least: int) -> None:
    while client.health().num_finished < at_least:
        time.sleep(0.02)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="micro-llama")
    p.add_argument("--num-prompts", type=int, default=2000)
    args = p.parse_args()
    import os
    env = {**os.environ, "STEPSERVE_MODEL": args.model, "STEPSERVE_KV_CACHE_GB": "0.5"}
    rng = random.Random(0)
    prompts = [[rng.randrange(4, 1000) for _ in range(16)] for _ in range(args.num_prompts)]
    params = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=16)
    figures: dict = {"model": args.model, "num_prompts": args.num_prompts}

    started = time.monotonic()
    compose("up", "-d", "--scale", "worker=2", env=env)
    with Client(ADDRESS, timeout_s=60) as client:
        client.wait_for_workers(2, timeout_s=600)
        figures["up_until_2_workers_s"] = round(time.monotonic() - started, 1)
        reference = [o.outputs[0].token_ids for o in client.generate_batch(prompts, params)]

        # 2. kill -9 the scheduler's container mid-batch, start it again.
        scheduler = container_id("scheduler")
        finished = client.health().num_finished
        thread, outputs = batch_in_thread(prompts, params)
        wait_finished(client, finished + 200)
        docker("kill", scheduler)
        thread.join(60)
        assert not thread.is_alive(), "the batch hung after the scheduler was killed"
        figures["killed_batch"] = error_counts(outputs)
        assert all(o.outputs[0].token_ids == r for o, r in zip(outputs, reference) if o.ok)
    worker_ids = sorted(compose("ps", "-q", "worker").split())
    restarted = time.monotonic()
    docker("start", scheduler)
    with Client(ADDRESS, timeout_s=60) as client:
        client.wait_for_workers(2, timeout_s=60)
        figures["workers_back_after_start_s"] = round(time.monotonic() - restarted, 2)
        again = client.generate_batch(prompts[:200], params)
        figures["first_200_served_after_start_s"] = round(time.monotonic() - restarted, 2)
        assert [o.outputs[0].token_ids for o in again] == reference[:200]
        assert sorted(compose("ps", "-q", "worker").split()) == worker_ids, "the workers were replaced"
        figures["worker_restarts"] = [docker("inspect", "-f", "{{.RestartCount}}", w).strip() for w in worker_ids]

        # 3. docker-compose down with a batch in flight.
        finished = client.health().num_finished
        thread, outputs = batch_in_thread(prompts, params)
        wait_finished(client, finished + 200)
    down_started = time.monotonic()
    compose("down", env=env)
    figures["down_s"] = round(time.monotonic() - down_started, 1)
    thread.join(60)
    assert not thread.is_alive(), "the batch hung through docker-compose down"
    figures["down_batch"] = error_counts(outputs)
    assert len(outputs) == len(prompts)
    assert all(o.ok or o.error_code in ("shutting_down", "scheduler_restarted") for o in outputs)
    assert all(o.outputs[0].token_ids == r for o, r in zip(outputs, reference) if o.ok)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
