"""The operating promises on a real docker engine, with the real compose.yaml (opt-in, not CI).

Run as root from the project's root, after `../shared/tools/local-docker.sh` (engine + image):

    python -m benchmarks.docker_proof [--model micro-llama] [--num-prompts 2000] [--curve]

--curve: the CurveZMQ way (keys written to ./keys by `stepserve keys generate` if absent,
STEPSERVE_CURVE_KEYS=/keys); the host's client holds keys/scheduler.key and keys/client.key_secret.

1. `docker-compose up -d --scale worker=2`; an SDK client on the host (the frontend is published
   on 127.0.0.1:5555) waits for both workers.
2. `docker kill` of the scheduler container with a batch in flight, then `docker start`: the
   batch returns (lost requests fail with scheduler_restarted), and the time until both workers
   (never restarted) have joined again and a batch is served is measured; the promise is 10 s.
3. `docker-compose down` with a batch in flight: the batch returns every output (completed, or
   failed with shutting_down), none hanging; how long `down` took, and each container's exit
   code (0: it drained and left on its own, before compose's stop_grace_period ran out).
Prints one JSON line of figures.
"""
import argparse
import json
import os
import random
import subprocess
import threading
import time

from client_sdk import Client, SamplingParams
from protocol.curve import generate_keys

ADDRESS = "tcp://127.0.0.1:5555"
CLIENT_KEYS: dict[str, str] = {}  # with --curve: the host client's curve_server_key / curve_secret_key


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


batch_returned: list[float] = []  # when the last batch in a thread returned


def batch_in_thread(prompts, params) -> tuple[threading.Thread, list]:
    result: list = []

    def run():
        with Client(ADDRESS, timeout_s=60, **CLIENT_KEYS) as client:
            result.extend(client.generate_batch(prompts, params))
        batch_returned[:] = [time.monotonic()]
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


def watch_exits(ids: list[str]) -> tuple[dict[str, tuple[int, float]], list[threading.Thread]]:
    """`docker wait` on each container: its exit code and when it exited, read before `down`
    removes it."""
    exits: dict[str, tuple[int, float]] = {}

    def wait(container: str) -> None:
        code = subprocess.run(["docker", "wait", container], capture_output=True, text=True, timeout=120).stdout
        exits[container] = (int(code), time.monotonic())
    threads = [threading.Thread(target=wait, args=(i,)) for i in ids]
    for thread in threads:
        thread.start()
    return exits, threads


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="micro-llama")
    p.add_argument("--num-prompts", type=int, default=2000)
    p.add_argument("--curve", action="store_true", help="CurveZMQ on every link (keys in ./keys)")
    args = p.parse_args()
    env = {**os.environ, "STEPSERVE_MODEL": args.model, "STEPSERVE_KV_CACHE_GB": "0.5"}
    if args.curve:
        keys = os.path.abspath("keys")
        if not os.path.exists(os.path.join(keys, "scheduler.key")):
            generate_keys(keys)
        env.update(STEPSERVE_CURVE_KEYS="/keys", STEPSERVE_KEYS_DIR=keys)
        CLIENT_KEYS.update(curve_server_key=os.path.join(keys, "scheduler.key"),
                           curve_secret_key=os.path.join(keys, "client.key_secret"))
    rng = random.Random(0)
    prompts = [[rng.randrange(4, 1000) for _ in range(16)] for _ in range(args.num_prompts)]
    params = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=16)
    figures: dict = {"model": args.model, "num_prompts": args.num_prompts, "curve": args.curve}

    started = time.monotonic()
    compose("up", "-d", "--scale", "worker=2", env=env)
    with Client(ADDRESS, timeout_s=60, **CLIENT_KEYS) as client:
        client.wait_for_workers(2, timeout_s=600)
        figures["up_until_2_workers_s"] = round(time.monotonic() - started, 1)
        batch_started = time.monotonic()
        reference = [o.outputs[0].token_ids for o in client.generate_batch(prompts, params)]
        figures["batch_s"] = round(time.monotonic() - batch_started, 1)

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
    with Client(ADDRESS, timeout_s=60, **CLIENT_KEYS) as client:
        client.wait_for_workers(2, timeout_s=60)
        figures["workers_back_after_start_s"] = round(time.monotonic() - restarted, 2)
        assert figures["workers_back_after_start_s"] < 10, figures  # the promise
        again = client.generate_batch(prompts[:200], params)
        figures["first_200_served_after_start_s"] = round(time.monotonic() - restarted, 2)
        assert [o.outputs[0].token_ids for o in again] == reference[:200]
        assert sorted(compose("ps", "-q", "worker").split()) == worker_ids, "the workers were replaced"
        figures["worker_restarts"] = [docker("inspect", "-f", "{{.RestartCount}}", w).strip() for w in worker_ids]

        # 3. docker-compose down with a batch in flight.
        finished = client.health().num_finished
        thread, outputs = batch_in_thread(prompts, params)
        wait_finished(client, finished + 200)
    services = {"scheduler": [scheduler], "worker": worker_ids, "gateway": compose("ps", "-q", "gateway").split()}
    exits, watchers = watch_exits([i for ids in services.values() for i in ids])
    time.sleep(0.5)  # every `docker wait` attached
    down_started = time.monotonic()
    compose("down", env=env)
    figures["down_s"] = round(time.monotonic() - down_started, 1)
    for watcher in watchers:
        watcher.join(60)
    figures["down_exit_codes"] = {name: [exits[i][0] for i in ids] for name, ids in services.items()}
    figures["down_exited_after_s"] = {name: [round(exits[i][1] - down_started, 1) for i in ids]
                                      for name, ids in services.items()}
    thread.join(60)
    assert not thread.is_alive(), "the batch hung through docker-compose down"
    figures["down_batch_returned_after_s"] = round(batch_returned[0] - down_started, 1)
    figures["down_batch"] = error_counts(outputs)
    assert len(outputs) == len(prompts)
    assert all(o.ok or o.error_code in ("shutting_down", "scheduler_restarted") for o in outputs)
    assert all(o.outputs[0].token_ids == r for o, r in zip(outputs, reference) if o.ok)
    assert all(code == 0 for codes in figures["down_exit_codes"].values() for code in codes), figures
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
