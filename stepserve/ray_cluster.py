"""RayCluster: the service LocalCluster starts, its processes placed as Ray actors over a Ray
cluster's nodes (`stepserve up --ray`, `stepserve serve --ray`).

The scheduler (and the gateway, for `serve`) run on the head node; each data-parallel replica is
an actor with its own resources (num_cpus, and one GPU per rank on CUDA), spread over the nodes.
An actor does not run stepserve's code in its own process: it starts the same process a
LocalCluster would (LocalCluster's own code, on that node), so the ZeroMQ data path is the
same as without Ray, and exits when that process does. A worker actor is restarted by Ray
(max_restarts) when it or its process dies: its __init__ starts a new worker that joins the
scheduler again, while the scheduler requeues the dead worker's requests.

Workers reach the scheduler at the head node's address: a worker address on loopback (the
default of `up`) is bound on the head's IP instead. CurveZMQ keys (--curve-keys DIR) travel to
each actor with its arguments and are written to a private folder on its node.
"""
import os
import sys
import tempfile
import threading
import time

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from client_sdk.sync_client import Client
from stepserve.default_replicas import flag_value, runs_on_cpu
from stepserve.launcher import LocalCluster, ProcessExited, model_line

HEAD_RESOURCE = "node:__internal_head__"  # Ray's own marker of the head node


class ServiceProcess:
    """A Ray actor that runs one part of the service on its node (the scheduler, a replica's
    worker processes, or a gateway) through a LocalCluster of its own, and exits with it."""

    def __init__(self, role: str, model: str, options: dict, key_files: dict[str, bytes]):
        keys_dir = _write_keys(key_files) if key_files else None
        # Started here, on the actor's main thread: the processes die with the actor
        # (child_processes.py binds them to the thread that spawned them).
        self.cluster = LocalCluster(model, 1, scheduler_args=options.get("scheduler_args", ()),
                                    worker_args=options.get("worker_args", ()), quiet=False,
                                    tensor_parallel_size=options.get("tensor_parallel_size", 1),
                                    curve_keys=keys_dir)
        self.url = None
        timeout_s = options.get("timeout_s", 600.0)
        if role == "scheduler":
            node_ip = ray.util.get_node_ip_address()
            worker_address = options["worker_address"].replace("127.0.0.1", node_ip).replace("localhost", node_ip)
            self.cluster.start_scheduler(options["frontend"], worker_address, timeout_s)
        elif role == "replica":
            self.cluster.worker_address = options["worker_address"]
            self.cluster.add_replica()
        else:
            self.cluster.address = options["scheduler_address"]
            self.url = self.cluster.start_gateway(options["gateway_args"], options["host"], options["port"], timeout_s)
        threading.Thread(target=self._exit_with_the_process, name="stepserve-watch", daemon=True).start()

    def _exit_with_the_process(self) -> None:
        while True:
            try:
                self.cluster.check_alive()
            except ProcessExited as e:
                print(f"stepserve: {e}", file=sys.stderr, flush=True)
                os._exit(1)  # an actor that dies unexpectedly is what Ray restarts
            except ValueError:  # its log closed: the cluster was stopped, the actor is ending
                return
            time.sleep(0.2)

    def addresses(self) -> tuple[str | None, str | None, str | None]:
        """The scheduler's frontend and worker addresses, and the gateway's URL."""
        return self.cluster.address, self.cluster.worker_address, self.url

    def where(self) -> tuple[str, int]:
        """(Ray node id, this actor's process id)."""
        return ray.get_runtime_context().get_node_id(), os.getpid()


class RayCluster:
    """LocalCluster's interface (start, add_replica, start_gateway, stop, address, base_url)
    over Ray actors, for the service a LocalCluster describes (`spec`: model, replicas, flags,
    addresses, CurveZMQ keys; never started itself). ray_address: a running Ray cluster
    ("auto", "ray://HOST:10001", an address); None starts a local one (or joins $RAY_ADDRESS),
    shut down again by stop(). num_cpus_per_worker: each worker process's Ray CPUs, and its
    torch threads on a CPU."""

    def __init__(self, spec: LocalCluster, *, ray_address: str | None = None, num_cpus_per_worker: float = 1.0):
        self.spec = spec
        self.model = spec.model
        self.data_parallel_size = spec.data_parallel_size
        self.tensor_parallel_size = spec.tensor_parallel_size
        self.worker_address = spec.worker_address  # the scheduler's, once it has bound it
        self.ray_address = ray_address
        self.num_cpus_per_worker = num_cpus_per_worker
        self.key_files = _read_keys(spec.curve_keys) if spec.curve_keys else {}
        self.scheduler = None
        self.replicas: list = []
        self.gateways: list = []
        self.address: str | None = None
        self.base_url: str | None = None
        self.startup_s: float | None = None  # from ray.init to every worker joined
        self.ray_init_s: float | None = None  # ray.init alone (0 when Ray was already initialized)
        self._started_ray = False

    @property
    def client_keys(self) -> dict[str, str]:
        return self.spec.client_keys

    @property
    def num_worker_processes(self) -> int:
        return self.spec.num_worker_processes

    def start(self, timeout_s: float = 600.0) -> "RayCluster":
        started = time.monotonic()
        try:
            if not ray.is_initialized():
                ray.init(address=self.ray_address, log_to_driver=self.spec.announce)
                self._started_ray = True
            self.ray_init_s = time.monotonic() - started
            self.scheduler = self._actor("scheduler", {"frontend": self.spec.frontend,
                                                       "worker_address": self.worker_address,
                                                       "scheduler_args": self.spec.scheduler_args,
                                                       "timeout_s": timeout_s}, on_head=True)
            self.address, self.worker_address, _ = ray.get(self.scheduler.addresses.remote(), timeout=timeout_s)
            for _ in range(self.data_parallel_size):
                self.add_replica()
            with Client(self.address, **self.client_keys) as client:
                client.wait_for_workers(self.num_worker_processes, timeout_s)
                self.startup_s = time.monotonic() - started
                self._say(model_line(client.model_info(), self.startup_s) + f"; on Ray ({_where(self.replicas)})")
        except BaseException:
            self.stop()
            raise
        return self

    def add_replica(self):
        """One more data-parallel replica, on whichever node Ray spreads it to; it joins the
        running scheduler (one call, on a running service too)."""
        options = {"worker_address": self.worker_address, "tensor_parallel_size": self.tensor_parallel_size,
                   "worker_args": [*self.spec.worker_args, *self._thread_args()]}
        replica = self._actor("replica", options, num_cpus=self.num_cpus_per_worker * self.tensor_parallel_size,
                              num_gpus=self.tensor_parallel_size if self._on_cuda() else 0)
        self.replicas.append(replica)
        return replica

    def start_gateway(self, args: list[str] = (), host: str = "127.0.0.1", port: int = 0,
                      timeout_s: float = 120.0) -> str:
        gateway = self._actor("gateway", {"scheduler_address": self.address, "gateway_args": list(args),
                                          "host": host, "port": port, "timeout_s": timeout_s}, on_head=True)
        self.gateways.append(gateway)
        url = ray.get(gateway.addresses.remote(), timeout=timeout_s)[2]
        self.base_url = self.base_url or url
        return url

    def service_exited(self) -> str | None:
        """The role of the scheduler or a gateway whose actor is gone (replicas come back)."""
        for role, actor in (("scheduler", self.scheduler), *(("gateway", g) for g in self.gateways)):
            try:
                ray.get(actor.addresses.remote(), timeout=30)
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                return role
        return None

    def stop(self, timeout_s: float = 10.0) -> None:
        for actor in [*self.gateways, *self.replicas, self.scheduler]:
            if actor is not None:
                ray.kill(actor, no_restart=True)
        self.gateways, self.replicas, self.scheduler = [], [], None
        if self._started_ray:
            ray.shutdown()
            self._started_ray = False

    def _actor(self, role: str, options: dict, *, on_head: bool = False, num_cpus: float = 0, num_gpus: float = 0):
        remote = ray.remote(ServiceProcess).options(
            num_cpus=num_cpus, num_gpus=num_gpus, max_restarts=0 if on_head else -1,
            scheduling_strategy=NodeAffinitySchedulingStrategy(_head_node_id(), soft=False) if on_head else "SPREAD")
        return remote.remote(role, self.model, options, self.key_files)

    def _on_cuda(self) -> bool:
        return not runs_on_cpu(self.spec.worker_args)

    def _thread_args(self) -> list[str]:
        if flag_value(self.spec.worker_args, "--threads") or self._on_cuda() or self.num_cpus_per_worker < 1:
            return []
        return ["--threads", str(int(self.num_cpus_per_worker))]

    def _say(self, status: str) -> None:
        self.spec._say(status)

    def __enter__(self) -> "RayCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _head_node_id() -> str:
    return next(n["NodeID"] for n in ray.nodes() if n["Alive"] and HEAD_RESOURCE in n["Resources"])


def _where(replicas: list) -> str:
    nodes = [node for node, _ in ray.get([r.where.remote() for r in replicas])]
    return f"{len(replicas)} replica(s) on {len(set(nodes))} node(s)"


def _read_keys(folder: str) -> dict[str, bytes]:
    files = {}
    for root, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                files[os.path.relpath(path, folder)] = f.read()
    return files


def _write_keys(files: dict[str, bytes]) -> str:
    folder = tempfile.mkdtemp(prefix="stepserve-keys-")  # 0700: the secrets are this user's alone
    for relpath, data in files.items():
        path = os.path.join(folder, relpath)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
    return folder
