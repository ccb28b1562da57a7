"""How many data-parallel replicas a local cluster starts when the caller leaves it unset, and
how many CPU threads each CPU worker then takes.

On a CPU, a small model runs fastest as one replica per core, each worker on one torch thread.
Its matrices are too small to share between threads: each operator of a step would fork over
them and meet at a barrier, so a second thread buys little, while a second replica runs a whole
second batch. A larger model keeps one replica with every core's threads: its matrices are
large enough to share, and each replica would stream a copy of its weights every step.
Measured on a 2-vCPU AMD EPYC (avx512_bf16), bfloat16, `stepserve bench throughput`, quiet host
(load ~1), one replica (the model's own thread choice) against 2 replicas of one thread:
micro-llama (2.4 MB of weights on disk) 10,000 prompts 1,731 / 1,638 against 2,532 / 2,245
requests/s; tiny-llama (81 MB) 5,000 prompts 445 against 490; tiny-opt (125M shape, 487 MB)
400 prompts 46.2 against 27.4, where one replica of two threads wins.

The size is worker_svc/model_size.py's weight_bytes, the measure worker_svc/cpu_threads.py takes
too; the threshold is this module's own, since the thread rule answers another question (one
thread against several within one worker).
"""
import os
from collections.abc import Sequence

# One scheduler process plans every replica's steps: past this many its planning, not the
# workers, would bound the throughput.
MAX_REPLICAS = 8
# Weight bytes (worker_svc.model_size.weight_bytes) up to which a model counts as small: between
# tiny-llama's 81 MB, where two replicas won, and tiny-opt's 487 MB, where one did.
SMALL_MODEL_BYTES = 256 << 20
_GiB = 1 << 30


def usable_cpus() -> int:
    """The cores this process may run on (its affinity, which a container's limits set)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def flag_value(args: Sequence[str], flag: str) -> str | None:
    """The value of `flag` in a command line (`--flag V` or `--flag=V`; the last one wins, as
    argparse has it); None if absent."""
    value = None
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
    return value


def runs_on_cpu(worker_args: Sequence[str]) -> bool:
    """Whether workers started with these flags run on the CPU (the worker's default device)."""
    device = flag_value(worker_args, "--device") or "cpu"
    return device == "cpu" and flag_value(worker_args, "--devices") is None


def _available_memory_bytes() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def default_data_parallel_size(model: str, worker_args: Sequence[str], tensor_parallel_size: int) -> int:
    """One replica per usable core (at most MAX_REPLICAS, and as many copies of the weights and
    KV cache as fit in half the available memory) for a small model on a CPU whose workers
    have no --threads of their own; else 1."""
    if tensor_parallel_size > 1 or not runs_on_cpu(worker_args) or flag_value(worker_args, "--threads"):
        return 1
    from worker_svc.model_size import weight_bytes  # files and config dicts only: no torch
    weights = weight_bytes(model)
    if weights > SMALL_MODEL_BYTES:
        return 1
    replicas = min(usable_cpus(), MAX_REPLICAS)
    available = _available_memory_bytes()
    if available is not None:
        from worker_svc.runner_config import RunnerConfig  # the worker's default, one owner; no torch
        kv_cache_gb = float(flag_value(worker_args, "--kv-cache-gb") or RunnerConfig.kv_cache_gb)
        replicas = min(replicas, int(available / 2 // (weights + kv_cache_gb * _GiB + 1)))
    return max(1, replicas)


def threads_per_worker(num_worker_processes: int) -> int:
    """CPU workers side by side split the cores, or their thread pools fight over them."""
    return max(1, usable_cpus() // num_worker_processes)
