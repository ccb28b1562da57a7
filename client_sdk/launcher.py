"""LocalCluster: a scheduler and N worker processes on this machine, on loopback ports.

Used by `LLM`, `stepserve up`, `stepserve bench` and the end-to-end tests. The scheduler binds
random ports and prints them on its ready line, so clusters never collide.
"""
import os
import re
import subprocess
import sys
import tempfile
import threading
import time

READY = re.compile(r"stepserve scheduler ready frontend=(\S+) workers=(\S+)")


class LocalCluster:
    def __init__(self, model: str = "tiny-llama", num_workers: int = 1, *, scheduler_args: list[str] = (),
                 worker_args: list[str] = (), frontend: str = "tcp://127.0.0.1:*",
                 workers: str = "tcp://127.0.0.1:*", quiet: bool = True):
        self.model = model
        self.num_workers = num_workers
        self.scheduler_args = list(scheduler_args)
        self.worker_args = list(worker_args)
        self.frontend = frontend
        self.workers_address = workers
        self.quiet = quiet
        self.scheduler: subprocess.Popen | None = None
        self.worker_procs: list[subprocess.Popen] = []
        self.address: str | None = None

    def _popen(self, module: str, args: list[str], stdout=None) -> subprocess.Popen:
        # Quiet: stderr goes to a temporary file, read back only to explain an early exit.
        stderr = tempfile.TemporaryFile() if self.quiet else None
        proc = subprocess.Popen([sys.executable, "-m", module, *args], stdout=stdout, stderr=stderr,
                                env=os.environ.copy(), start_new_session=True)
        proc.stderr_file = stderr
        return proc

    def check_alive(self) -> None:
        """Raises with the tail of its log if any process of the cluster has exited."""
        for proc in [self.scheduler, *self.worker_procs]:
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"{' '.join(proc.args[2:4])} exited with code {proc.returncode}:\n"
                                   f"{_tail(proc.stderr_file)}")

    def start(self, timeout_s: float = 120.0) -> "LocalCluster":
        self.scheduler = self._popen("scheduler_svc", ["--frontend", self.frontend, "--workers",
                                                       self.workers_address, *self.scheduler_args],
                                     stdout=subprocess.PIPE)
        self.address, self.workers_address = self._await_ready(timeout_s)
        for _ in range(self.num_workers):
            self.add_worker()
        return self

    def _await_ready(self, timeout_s: float) -> tuple[str, str]:
        found: list[tuple[str, str]] = []
        stream = self.scheduler.stdout

        def read() -> None:
            for line in iter(stream.readline, b""):
                match = READY.search(line.decode(errors="replace"))
                if match and not found:
                    found.append((match.group(1), match.group(2)))
            stream.close()

        threading.Thread(target=read, daemon=True).start()
        deadline = time.monotonic() + timeout_s
        while not found:
            self.check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError(f"scheduler not ready in {timeout_s} s")
            time.sleep(0.01)
        return found[0]

    def add_worker(self, extra_args: list[str] = ()) -> subprocess.Popen:
        args = [*self.worker_args, *extra_args]
        if "--threads" not in args and "--device" not in args and self.num_workers > 1:
            # CPU workers side by side: split the cores, or their thread pools fight over them.
            args += ["--threads", str(max(1, (os.cpu_count() or 1) // self.num_workers))]
        proc = self._popen("worker_svc", ["--scheduler", self.workers_address, "--model", self.model, *args])
        self.worker_procs.append(proc)
        return proc

    def stop(self, timeout_s: float = 10.0) -> None:
        procs = [p for p in self.worker_procs + [self.scheduler] if p is not None]
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + timeout_s
        for proc in procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.stderr_file is not None:
                proc.stderr_file.close()

    def wait_for_workers(self, client, num_workers: int, timeout_s: float = 300.0) -> None:
        """Until `num_workers` have joined, through a blocking Client; fails fast if one dies."""
        deadline = time.monotonic() + timeout_s
        while client.health().num_workers < num_workers:
            self.check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError(f"{num_workers} workers did not join in {timeout_s} s")
            time.sleep(0.05)

    def __enter__(self) -> "LocalCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _tail(stderr_file, num_bytes: int = 4000) -> str:
    if stderr_file is None:
        return "(its log went to this terminal)"
    stderr_file.seek(0, os.SEEK_END)
    stderr_file.seek(max(0, stderr_file.tell() - num_bytes))
    return stderr_file.read().decode(errors="replace")
