"""Command-line flags that describe a local cluster, shared by `stepserve` subcommands."""
import argparse
import contextlib
from collections.abc import Iterator

from client_sdk.launcher import LocalCluster


def add_cluster_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="tiny-llama", help="preset name or Hugging Face model folder")
    p.add_argument("--workers", type=int, default=1, help="data-parallel replicas (each a worker, or a TP group)")
    p.add_argument("--tensor-parallel-size", type=int, default=1, help="worker processes per replica")
    p.add_argument("--dtype", default=None, help="float32 | bfloat16 | float16 | auto")
    p.add_argument("--load-format", default=None, help="auto | dummy")
    p.add_argument("--kv-cache-gb", type=float, default=None)
    p.add_argument("--device", default=None, help="cpu | cuda:N")
    p.add_argument("--max-num-seqs", type=int, default=None)
    p.add_argument("--max-num-batched-tokens", type=int, default=None)
    p.add_argument("--preemption", default=None, choices=["recompute", "swap"])
    p.add_argument("--enforce-eager", action="store_true",
                   help="run the model op by op instead of the compiled step (faster start-up)")
    p.add_argument("--compile-cache-dir", default=None,
                   help="where compiled graphs persist across starts (default ~/.cache/stepserve)")
    p.add_argument("--curve-keys", default=None, metavar="DIR",
                   help="CurveZMQ on every link, with the keys of `stepserve keys generate DIR` "
                        "(default: $STEPSERVE_CURVE_KEYS)")
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None,
                   help="share the KV of common prompt prefixes (default: on for attention models)")


def cluster_args(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """Splits the cluster flags into the scheduler's and the workers' command lines."""
    scheduler, worker = [], []
    for name, target in (("max_num_seqs", scheduler), ("max_num_batched_tokens", scheduler),
                         ("preemption", scheduler), ("dtype", worker), ("load_format", worker),
                         ("kv_cache_gb", worker), ("device", worker), ("compile_cache_dir", worker)):
        value = getattr(args, name, None)
        if value is not None:
            target += ["--" + name.replace("_", "-"), str(value)]
    if getattr(args, "enforce_eager", False):
        worker.append("--enforce-eager")
    caching = getattr(args, "enable_prefix_caching", None)
    if caching is not None:
        scheduler.append("--enable-prefix-caching" if caching else "--no-enable-prefix-caching")
    return scheduler, worker


@contextlib.contextmanager
def service_address(args: argparse.Namespace) -> Iterator[str]:
    """--address if given; otherwise a local cluster started from the flags, stopped on exit."""
    if args.address is not None:
        yield args.address
        return
    scheduler, worker = cluster_args(args)
    with LocalCluster(args.model, args.workers, scheduler_args=scheduler, worker_args=worker,
                      tensor_parallel_size=args.tensor_parallel_size, curve_keys=args.curve_keys) as cluster:
        yield cluster.address
