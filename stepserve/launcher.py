"""LocalCluster: a scheduler, N worker replicas (each one process, or a tensor-parallel group)
and optionally an HTTP gateway, on this machine, on loopback ports.

Used by `LLM`, `stepserve up` / `serve`, `stepserve bench` and the end-to-end tests. The
scheduler and the gateway bind random ports and print them on their ready lines, so clusters
never collide. Every process dies with the one that started the cluster (child_processes.py).
With curve_keys (a folder from `stepserve keys generate`, default $STEPSERVE_CURVE_KEYS) every
link uses CurveZMQ, each process with its own role's key.

start() returns once every worker has joined the scheduler, or raises ProcessExited with the
dead process's own last error line as soon as any process of the cluster exits: every caller
(LLM, the `stepserve` commands, the benchmarks) fails fast the same way. A Hugging Face hub id
is fetched here first (local_model), for all the workers of this host. With announce=True
it says on stderr what it is doing: a worker compiling, then one line with the model, dtype,
device and whether the step is compiled.
"""
import functools
import importlib.util
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import weakref

from client_sdk.sync_client import Client
from protocol.curve import AUTHORIZED, ENV_VARS, KEYS_DIR_ENV
from stepserve.child_processes import spawn, stop_all
from stepserve.default_replicas import default_data_parallel_size, flag_value, runs_on_cpu, threads_per_worker
from stepserve.process_output import follow_stdout, last_error_line, tail, tee_stderr

READY = re.compile(r"stepserve scheduler ready frontend=(\S+) workers=(\S+)(?: metrics=(\S+))?")
GATEWAY_READY = re.compile(r"stepserve gateway ready url=(\S+)")
# What each process imports beyond the base install: pyproject.toml's `server` extra.
SERVER_EXTRA_MODULES = {"worker_svc": ("torch", "safetensors"), "gateway_svc": ("fastapi", "uvicorn")}
_ROLES = {"scheduler_svc": "the scheduler", "worker_svc": "a worker", "gateway_svc": "the gateway"}


class MissingExtra(ModuleNotFoundError):
    """A process of the cluster needs packages of an extra this install lacks."""


class ProcessExited(RuntimeError):
    """A process of a local cluster exited. str(): which, its exit status and its last error
    line; .log: the end of its log."""

    def __init__(self, proc: subprocess.Popen):
        tee = getattr(proc, "stderr_tee", None)
        if tee is not None:
            tee.join(timeout=2.0)  # the log's last lines may still be on their way
        self.log = tail(proc.stderr_file)
        self.error_line = last_error_line(self.log)
        self.returncode = proc.returncode
        super().__init__(f"{_ROLES.get(proc.args[2], proc.args[2])} exited with code {proc.returncode}: "
                         f"{self.error_line}")


class LocalCluster:
    def __init__(self, model: str = "tiny-llama", data_parallel_size: int | None = None, *,
                 scheduler_args: list[str] = (),
                 worker_args: list[str] = (), frontend: str = "tcp://127.0.0.1:*",
                 worker_address: str = "tcp://127.0.0.1:*", quiet: bool = True, tensor_parallel_size: int = 1,
                 curve_keys: str | None = None, announce: bool = False):
        """data_parallel_size: replicas, each of tensor_parallel_size worker processes; None:
        one per core for a small model on a CPU, else one (default_replicas.py);
        worker_address: where the scheduler listens for them;
        announce: say on stderr what start() is doing (the CLI and LLM do)."""
        if tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size must be >= 1, got {tensor_parallel_size}")
        self.model = model
        self.scheduler_args = list(scheduler_args)
        self.worker_args = list(worker_args)
        if data_parallel_size is None:
            data_parallel_size = default_data_parallel_size(self.local_model, worker_args, tensor_parallel_size)
        self.data_parallel_size = data_parallel_size
        self.tensor_parallel_size = tensor_parallel_size
        self.frontend = frontend
        self.worker_address = worker_address
        self.quiet = quiet
        self.announce = announce
        self.status_lines: list[str] = []  # what start() said (or would have), each line once
        self.scheduler: subprocess.Popen | None = None
        self.worker_procs: list[subprocess.Popen] = []
        self.gateways: list[subprocess.Popen] = []  # any number may share the scheduler
        self.address: str | None = None
        self.base_url: str | None = None  # the first gateway's, once started
        self.metrics_url: str | None = None  # the scheduler's, with --metrics-port
        self.curve_keys = curve_keys or os.environ.get(KEYS_DIR_ENV) or None
        self._processes: list[subprocess.Popen] = []  # every one started, for the finalizer
        self._finalizer = weakref.finalize(self, stop_all, self._processes)

    @functools.cached_property
    def local_model(self) -> str:
        """The preset or folder this host's workers load for the model: a hub id resolved here
        as each worker resolves it (with their --revision, --download-dir and --load-format),
        so that it is downloaded once, before any worker starts, and a model that cannot be had
        fails at once with model_source.ModelUnavailable's one line. Resolved once per cluster."""
        from worker_svc.model_source import resolve_model  # no torch; huggingface_hub for a hub id only
        args = self.worker_args
        return resolve_model(self.model, flag_value(args, "--revision"), flag_value(args, "--download-dir"),
                             flag_value(args, "--load-format") or "auto")

    def _key(self, name: str) -> str:
        return os.path.join(self.curve_keys, name)

    @property
    def client_keys(self) -> dict[str, str]:
        """AsyncClient / Client arguments that reach this cluster's scheduler."""
        if not self.curve_keys:
            return {}
        return {"curve_server_key": self._key("scheduler.key"), "curve_secret_key": self._key("client.key_secret")}

    def _curve_args(self, role: str) -> list[str]:
        if not self.curve_keys:
            return []
        if role == "scheduler":
            return ["--curve-secret-key", self._key("scheduler.key_secret"),
                    "--curve-authorized-keys", self._key(AUTHORIZED)]
        return ["--curve-server-key", self._key("scheduler.key"), "--curve-secret-key", self._key(f"{role}.key_secret")]

    @property
    def num_worker_processes(self) -> int:
        """What the scheduler's health counts as workers once all have joined: every rank."""
        return self.data_parallel_size * self.tensor_parallel_size

    def _popen(self, module: str, args: list[str]) -> subprocess.Popen:
        missing = [name for name in SERVER_EXTRA_MODULES.get(module, ()) if importlib.util.find_spec(name) is None]
        if missing:
            raise MissingExtra(f"{module} needs {', '.join(missing)}, which this Python lacks: the base "
                               "install is the SDK alone; install the server extra (pip install "
                               "'stepserve[server]', torch first as README.md says)", name=missing[0])
        # stderr is kept in a temporary file, to explain an early exit; echoed here unless quiet.
        log = tempfile.TemporaryFile()
        # Keys travel as flags, each process its own: a caller's client keys must not leak into them.
        env = {k: v for k, v in os.environ.items() if k not in ENV_VARS}
        proc = spawn([sys.executable, "-m", module, *args], stdout=subprocess.PIPE,
                     stderr=log if self.quiet else subprocess.PIPE, env=env, start_new_session=True)
        proc.stderr_file = log
        proc.stderr_tee = None if self.quiet else tee_stderr(proc, log)
        self._processes.append(proc)
        return proc

    def check_alive(self) -> None:
        """Raises ProcessExited if any process of the cluster has exited."""
        for proc in [self.scheduler, *self.worker_procs, *self.gateways]:
            if proc is not None and proc.poll() is not None:
                raise ProcessExited(proc)

    def service_exited(self) -> str | None:
        """The module of the scheduler or a gateway that has exited (workers may come and go)."""
        return next((proc.args[2] for proc in (self.scheduler, *self.gateways)
                     if proc is not None and proc.poll() is not None), None)

    def start(self, timeout_s: float = 600.0) -> "LocalCluster":
        """The scheduler and every replica, returning when all workers have joined (a first
        start compiles the model's step: minutes on a small CPU)."""
        started = time.monotonic()
        try:
            self.local_model  # noqa: B018 - resolves (and fetches) the model before any worker starts
            self.start_scheduler(self.frontend, self.worker_address, timeout_s)
            for _ in range(self.data_parallel_size):
                self.add_replica()
            if self.data_parallel_size:
                with Client(self.address, **self.client_keys) as client:
                    self.wait_for_workers(client, self.num_worker_processes, timeout_s)
                    self._say(model_line(client.model_info(), time.monotonic() - started))
        except BaseException:
            self.stop()  # nothing of a cluster that failed to start outlives the failure
            raise
        return self

    def start_scheduler(self, frontend: str | None = None, worker_address: str | None = None,
                        timeout_s: float = 120.0) -> None:
        """(Re)starts the scheduler, by default on the addresses the last one bound."""
        self.scheduler = self._popen("scheduler_svc", ["--frontend", frontend or self.address, "--worker-address",
                                                       worker_address or self.worker_address, *self.scheduler_args,
                                                       *self._curve_args("scheduler")])
        self.address, self.worker_address, self.metrics_url = self._await_ready(self.scheduler, READY,
                                                                                 timeout_s).groups()

    def start_gateway(self, args: list[str] = (), host: str = "127.0.0.1", port: int = 0,
                      timeout_s: float = 120.0) -> str:
        """Starts an HTTP gateway on this cluster's scheduler; returns its base URL."""
        gateway = self._popen("gateway_svc", ["--scheduler", self.address, "--host", host, "--port", str(port),
                                              *args, *self._curve_args("client")])
        self.gateways.append(gateway)
        url = self._await_ready(gateway, GATEWAY_READY, timeout_s).group(1)
        self.base_url = self.base_url or url
        return url

    def _await_ready(self, proc: subprocess.Popen, ready: re.Pattern, timeout_s: float) -> re.Match:
        """The ready line's match; stdout keeps being read (and echoed unless quiet) after it."""
        found = follow_stdout(proc, echo=not self.quiet, ready=ready)
        deadline = time.monotonic() + timeout_s
        while not found:
            self.check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError(f"{proc.args[2]} not ready in {timeout_s} s")
            time.sleep(0.01)
        return found[0]

    def add_replica(self) -> list[subprocess.Popen]:
        """One data-parallel replica: a worker alone, or a tensor-parallel group of ranks that
        meet at a free loopback port."""
        size = self.tensor_parallel_size
        if size == 1:
            return [self.add_worker()]
        address = f"tcp://127.0.0.1:{_free_port()}"
        return [self.add_worker(["--tensor-parallel-size", str(size), "--rank", str(rank),
                                 "--dist-init-address", address]) for rank in range(size)]

    def add_worker(self, extra_args: list[str] = ()) -> subprocess.Popen:
        args = [*self.worker_args, *extra_args]
        num_procs = self.num_worker_processes
        if num_procs > 1 and runs_on_cpu(args) and not flag_value(args, "--threads"):
            args += ["--threads", str(threads_per_worker(num_procs))]
        proc = self._popen("worker_svc", ["--scheduler", self.worker_address, "--model", self.model, *args,
                                          *self._curve_args("worker")])
        follow_stdout(proc, echo=not self.quiet, on_status=self._say)
        self.worker_procs.append(proc)
        return proc

    def stop(self, timeout_s: float = 10.0) -> None:
        stop_all(self._processes, timeout_s)

    def _say(self, status: str) -> None:
        """A line about what the cluster is doing (on stderr if announce), each said once
        however many workers say it."""
        if status not in self.status_lines:
            self.status_lines.append(status)
            if self.announce:
                print(f"stepserve: {status}", file=sys.stderr, flush=True)

    def wait_for_workers(self, client, num_workers: int, timeout_s: float = 600.0) -> None:
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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def model_line(info, seconds: float) -> str:
    """What a started cluster says it serves, and how long it took."""
    step = "compiled step" if info.compiled else "eager step"
    return f"{info.model}, {info.dtype} on {info.device}, {step}; ready in {seconds:.0f} s"
