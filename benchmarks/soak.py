"""A soak: the processes of `stepserve serve --data-parallel-size 2` (scheduler, two workers,
gateway with a --batch-dir) under mixed traffic for --duration-s, with faults, and nothing may
be lost, answered twice, or grow.

    python -m benchmarks.soak --duration-s 1800 --out /tmp/soak30.json

Traffic (benchmarks/soak_clients.py, one process each): two of HTTP completions and chats
through the openai client (whole and streamed, n > 1, seeds, stop strings, structured outputs,
logprobs), one of clients that close their streams midway, one of SDK clients over ZeroMQ, one
running `stepserve run-batch` jobs and Batch API jobs in turn. The model: tiny-llama's shape
saved as a Hugging Face folder with a chat template (random weights), built once under
--work-dir.

Faults, every --fault-every-s (default: a third of the run, at most 3 minutes): a worker
SIGSTOPped for --stop-s then SIGCONTed, and a worker SIGKILLed and started again (as a
supervisor would: `stepserve serve` restarts nothing); once, mid-run, the scheduler SIGKILLed
and started again on its ports (LocalCluster.start_scheduler; `stepserve serve` would exit).

Every --sample-s it samples each process's RSS and open descriptors (/proc) and the gateway's
/metrics. It ends with a JSON result (--out, and the last line of stdout) and a table: requests
by kind and outcome, the errors' reasons, RSS and descriptor growth from the end of the warm-up
(5 minutes, or the first sixth of a shorter run) to the end, and ERROR lines. Exit status 1
when a request was lost, answered wrong or twice, a process grew more than --max-growth, the
scheduler kept requests after the traffic stopped, or an ERROR line no fault explains was logged.
"""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import Counter

from prometheus_client.parser import text_string_to_metric_families

from benchmarks.cpu_info import cpu_summary
from benchmarks.soak_probes import Watched, error_lines, grew_too_much
from client_sdk import Client
from stepserve.launcher import LocalCluster

CLIENTS = (("http", 4), ("http", 4), ("disconnect", 2), ("sdk", 4), ("batches", 1))  # (kind, concurrency)
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
GAUGES = ("stepserve:num_requests_running", "stepserve:num_requests_waiting", "stepserve:num_replicas_healthy",
          "stepserve:kv_cache_usage_perc")
# ERROR lines that a fault explains, by fault, when logged within EXPLAINED_WINDOW_S after it.
# None so far: what the processes say of a worker killed or stopped, or of a scheduler
# restarted, is at WARNING or below; a line added here says which fault it belongs to.
EXPLAINED: dict[str, list[re.Pattern]] = {
    "kill_worker": [],
    "stop_worker": [],
    "restart_scheduler": [],
}
EXPLAINED_WINDOW_S = 60.0
IDLE_TIMEOUT_S = 30.0  # the scheduler holds no request this long after the clients end


def model_folder(work_dir: str) -> str:
    """tiny-llama's shape as a Hugging Face folder with a chat template, made once."""
    folder = os.path.join(work_dir, "tiny-llama-chat")
    config_path = os.path.join(folder, "tokenizer_config.json")
    if not os.path.exists(config_path):
        from benchmarks.preset_folder import save_preset
        save_preset("tiny-llama", folder)
        with open(config_path) as f:
            config = json.load(f)
        with open(config_path, "w") as f:
            json.dump({**config, "chat_template": CHAT_TEMPLATE}, f)
    return folder


def fault_plan(duration_s: float, every_s: float) -> list[tuple[float, str]]:
    """(seconds from the start, fault): in each period a worker stopped, then one killed; the
    scheduler restarted once, late in the period that holds the middle of the run."""
    plan = []
    start = 0.0
    while start + 0.6 * every_s < duration_s - 10:
        plan += [(start + 0.25 * every_s, "stop_worker"), (start + 0.6 * every_s, "kill_worker")]
        if start <= duration_s / 2 < start + every_s:
            plan.append((start + 0.85 * every_s, "restart_scheduler"))
        start += every_s
    return sorted(plan)


class Soak:
    def __init__(self, args, cluster: LocalCluster, url: str):
        self.args, self.cluster, self.url = args, cluster, url
        self.watched: list[Watched] = []
        self.faults: list[dict] = []
        self.metrics: list[dict] = []
        self._stopped: list[tuple[float, Watched]] = []  # workers to SIGCONT, and when
        self._num_started: Counter = Counter()

    def watch(self, name: str, proc) -> Watched:
        self._num_started[name] += 1
        log = getattr(proc, "stderr_file", None)
        watched = Watched(f"{name}#{self._num_started[name]}", proc, log.fileno() if log else None)
        self.watched.append(watched)
        return watched

    def live_workers(self) -> list[Watched]:
        return [w for w in self.watched if w.name.startswith("worker") and not w.ended]

    def inject(self, kind: str) -> None:
        now = time.time()
        if kind == "stop_worker":
            worker = self.live_workers()[0]
            os.kill(worker.pid, signal.SIGSTOP)
            self._stopped.append((now + self.args.stop_s, worker))
        elif kind == "kill_worker":
            stopped = {w.pid for _, w in self._stopped}
            worker = next(w for w in reversed(self.live_workers()) if w.pid not in stopped)
            os.kill(worker.pid, signal.SIGKILL)
            worker.proc.wait()
            worker.ended = True
            self.cluster.worker_procs.remove(worker.proc)  # gone on purpose: its liveness is not checked
            self.watch("worker", self.cluster.add_worker())
        else:
            old = next(w for w in self.watched if w.name.startswith("scheduler") and not w.ended)
            os.kill(old.pid, signal.SIGKILL)
            old.proc.wait()
            old.ended = True
            self.cluster.start_scheduler()  # the same ports: workers and clients find it again
            self.watch("scheduler", self.cluster.scheduler)
        self.faults.append({"t": now, "at_s": round(now - self.started, 1), "kind": kind})
        print(f"soak: {self.faults[-1]['at_s']:7.1f} s  {kind}", flush=True)

    def resume_stopped(self, now: float) -> None:
        for entry in [e for e in self._stopped if e[0] <= now]:
            os.kill(entry[1].pid, signal.SIGCONT)
            self._stopped.remove(entry)

    def sample(self, now: float) -> None:
        for watched in self.watched:
            watched.sample(now)
        try:
            with urllib.request.urlopen(f"{self.url}/metrics", timeout=10) as response:
                text = response.read().decode()
        except (urllib.error.URLError, OSError):
            return
        values = {s.name: s.value for family in text_string_to_metric_families(text) for s in family.samples
                  if s.name in GAUGES}
        self.metrics.append({"t": round(now - self.started, 1), **values})

    def run(self) -> dict:
        args = self.args
        self.started = time.time()
        until = self.started + args.duration_s
        clients = self.start_clients(until)
        plan = [(self.started + at, kind) for at, kind in fault_plan(args.duration_s, args.fault_every_s)]
        next_sample = self.started
        while time.time() < until:
            now = time.time()
            self.resume_stopped(now)
            while plan and plan[0][0] <= now:
                self.inject(plan.pop(0)[1])
            if now >= next_sample:
                self.sample(now)
                next_sample += args.sample_s
            time.sleep(0.2)
        self.sample(time.time())
        self.resume_stopped(float("inf"))
        for proc in clients:
            proc.wait(timeout=600)
        idle_after_s = self.wait_until_idle()
        return self.result(until, idle_after_s)

    def start_clients(self, until: float) -> list[subprocess.Popen]:
        procs = []
        for i, (kind, concurrency) in enumerate(CLIENTS):
            log = open(os.path.join(self.args.work_dir, f"client-{i}-{kind}.log"), "wb+")
            proc = subprocess.Popen([sys.executable, "-m", "benchmarks.soak_clients", kind, "--url", self.url,
                                     "--address", self.cluster.address, "--until", str(until),
                                     "--out", self.records_path, "--concurrency", str(concurrency),
                                     "--seed", str(i)], stdout=log, stderr=subprocess.STDOUT)
            proc.stderr_file = log
            self.watch(f"client-{kind}", proc)
            procs.append(proc)
        return procs

    def save_logs(self) -> None:
        """Every process's log under --work-dir/logs, to read what the table counts."""
        folder = os.path.join(self.args.work_dir, "logs")
        os.makedirs(folder, exist_ok=True)
        for watched in self.watched:
            with open(os.path.join(folder, f"{watched.name}.log"), "w") as f:
                f.write("\n".join(watched.log_lines()) + "\n")

    @property
    def records_path(self) -> str:
        return os.path.join(self.args.work_dir, "requests.jsonl")

    def wait_until_idle(self) -> float | None:
        """Seconds until the scheduler holds no request once the clients have ended; None if it
        still holds some after IDLE_TIMEOUT_S (a request the server never let go)."""
        start = time.monotonic()
        with Client(self.cluster.address, timeout_s=30) as client:
            while time.monotonic() - start < IDLE_TIMEOUT_S:
                health = client.health()
                if health.num_running + health.num_waiting == 0:
                    return round(time.monotonic() - start, 1)
                time.sleep(0.2)
        return None

    def result(self, until: float, idle_after_s: float | None) -> dict:
        args = self.args
        with open(self.records_path) as f:
            records = [json.loads(line) for line in f]
        by_kind: dict[str, Counter] = {}
        for r in records:
            by_kind.setdefault(r["kind"], Counter())[r["outcome"]] += 1
        outcomes = Counter(r["outcome"] for r in records)
        answered = Counter(r["id"] for r in records if r["id"] and r["outcome"] != "lost")
        doubled = sorted(i for i, n in answered.items() if n > 1)
        warmup_s = min(300.0, args.duration_s / 6)
        growth = [w.growth(warmup_s, until) for w in self.watched]
        grown = [row["name"] for row in growth if grew_too_much(row, args.max_growth)]
        injected, unexpected = error_lines(self.watched, self.faults, EXPLAINED, EXPLAINED_WINDOW_S)
        self.save_logs()
        failures = []
        if outcomes["lost"]:
            failures.append(f"{outcomes['lost']} requests lost")
        if outcomes["wrong"]:
            failures.append(f"{outcomes['wrong']} answers wrong")
        if doubled:
            failures.append(f"{len(doubled)} ids answered twice")
        if grown:
            failures.append(f"grew more than {args.max_growth:.0%}: {', '.join(grown)}")
        if idle_after_s is None:
            failures.append(f"the scheduler still held requests {IDLE_TIMEOUT_S:.0f} s after the clients ended")
        if unexpected:
            failures.append(f"{len(unexpected)} ERROR lines no fault explains")
        if not records:
            failures.append("no request was made")
        return {
            "config": {k: v for k, v in vars(args).items()}, "cpu": cpu_summary(),
            "num_requests": len(records), "outcomes": dict(outcomes),
            "requests": {kind: dict(c) for kind, c in sorted(by_kind.items())},
            "errors": dict(Counter(r["detail"] for r in records if r["outcome"] == "error").most_common()),
            "wrong": [r for r in records if r["outcome"] == "wrong"][:20],
            "lost": [r for r in records if r["outcome"] == "lost"][:20],
            "doubled_ids": doubled[:20], "warmup_s": warmup_s, "processes": growth,
            "faults": [{k: v for k, v in f.items() if k != "t"} for f in self.faults],
            "idle_after_s": idle_after_s, "metrics_last": self.metrics[-1] if self.metrics else None,
            "error_lines": {"explained": len(injected), "unexplained": unexpected[:50]},
            "failures": failures, "ok": not failures,
        }


def print_table(result: dict) -> None:
    outcomes = ("ok", "cancelled", "error", "lost", "wrong")
    print(f"\n{'requests':<28}" + "".join(f"{o:>10}" for o in outcomes))
    for kind, counts in result["requests"].items():
        print(f"{kind:<28}" + "".join(f"{counts.get(o, 0):>10}" for o in outcomes))
    print(f"{'all':<28}" + "".join(f"{result['outcomes'].get(o, 0):>10}" for o in outcomes))
    if result["errors"]:
        print("\nerrors: " + ", ".join(f"{reason} x{n}" for reason, n in result["errors"].items()))
    print(f"\n{'process':<22}{'RSS MiB base':>14}{'end':>8}{'growth':>9}{'fds base':>10}{'end':>6}{'growth':>9}")
    for row in result["processes"]:
        if row["young"]:
            print(f"{row['name']:<22}  {'killed' if row['ended'] else 'started too late to measure'}")
            continue
        print(f"{row['name']:<22}{row['rss_mb_base']:>14}{row['rss_mb_end']:>8}{row['rss_growth']:>9.1%}"
              f"{row['fds_base']:>10}{row['fds_end']:>6}{row['fds_growth']:>9.1%}")
    lines = result["error_lines"]
    print(f"\nERROR lines: {lines['explained']} explained by the faults, {len(lines['unexplained'])} not")
    for line in lines["unexplained"][:10]:
        print("  " + "\n    ".join(text[:200] for text in line.splitlines()[:8]))
    faults = ", ".join(f"{f['kind']}@{f['at_s']}s" for f in result["faults"])
    print(f"faults: {faults}")
    print(f"idle after the clients: {result['idle_after_s']} s;  {result['cpu']}")
    print("PASS" if result["ok"] else "FAIL: " + "; ".join(result["failures"]), flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__.splitlines()[0])
    p.add_argument("--duration-s", type=float, default=1800.0)
    p.add_argument("--fault-every-s", type=float, default=None,
                   help="a worker stopped and one killed in each such period (default: a third of the run, "
                        "at most 180 s)")
    p.add_argument("--stop-s", type=float, default=3.0, help="how long a SIGSTOPped worker stays stopped")
    p.add_argument("--sample-s", type=float, default=None, help="(default: the run / 100, within 2 to 15 s)")
    p.add_argument("--max-growth", type=float, default=0.10, help="RSS or descriptors after the warm-up")
    p.add_argument("--work-dir", default="/tmp/stepserve-soak", help="the model folder, logs, request records")
    p.add_argument("--out", default=None, help="the JSON result")
    args = p.parse_args(argv)
    args.fault_every_s = args.fault_every_s or min(180.0, args.duration_s / 3)
    args.sample_s = args.sample_s or min(15.0, max(2.0, args.duration_s / 100))
    os.makedirs(args.work_dir, exist_ok=True)
    folder = model_folder(args.work_dir)
    for name in os.listdir(args.work_dir):
        if name.endswith((".log", ".jsonl")):
            os.remove(os.path.join(args.work_dir, name))
    batch_dir = os.path.join(args.work_dir, "batches")
    for old in (batch_dir, os.path.join(args.work_dir, "logs")):
        shutil.rmtree(old, ignore_errors=True)  # a run's batches and logs are its own
    with LocalCluster(folder, 2) as cluster:
        url = cluster.start_gateway(["--batch-dir", batch_dir])
        soak = Soak(args, cluster, url)
        soak.watch("scheduler", cluster.scheduler)
        for proc in cluster.worker_procs:
            soak.watch("worker", proc)
        soak.watch("gateway", cluster.gateways[0])
        result = soak.run()
    print_table(result)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    print(json.dumps({k: result[k] for k in ("ok", "num_requests", "outcomes", "failures")}))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
