"""Command-line flags that describe a local cluster, shared by `stepserve` subcommands."""
import argparse
import contextlib
from collections.abc import Iterator

from protocol.pooling import POOLING_TYPES, TASKS
from scheduler_svc.config import PREEMPTION_MODES, ROUTING_HELP, ROUTING_MODES, SCHEDULING_POLICIES
from stepserve.launcher import LocalCluster


def add_cluster_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="tiny-llama",
                   help="preset name, Hugging Face model folder, or hub id (ORG/NAME: downloaded into the hub's cache)")
    p.add_argument("--revision", default=None, help="of a hub id: the branch, tag or commit (default: main)")
    p.add_argument("--download-dir", default=None, metavar="DIR",
                   help="of a hub id: the Hugging Face cache to download into and read (default: HF_HUB_CACHE, "
                        "~/.cache/huggingface/hub)")
    p.add_argument("--data-parallel-size", type=int, default=None,
                   help="data-parallel replicas, each one worker or a tensor-parallel group (vLLM's name; "
                        "default: one per core for a small model on a CPU, else 1)")
    p.add_argument("--tensor-parallel-size", type=int, default=1, help="worker processes per replica")
    p.add_argument("--task", default=None, choices=TASKS,
                   help="what the model does (default auto: an encoder or sentence-transformers folder embeds, a "
                        "...ForSequenceClassification folder classifies, the rest generate; docs/pooling.md)")
    p.add_argument("--pooling-type", default=None, choices=POOLING_TYPES,
                   help="a pooling model's pooling, over the folder's (sentence-transformers' 1_Pooling) or the "
                        "default (CLS for an encoder, LAST for a causal model)")
    p.add_argument("--normalize", action=argparse.BooleanOptionalAction, default=None,
                   help="a pooling model's embeddings L2-normalised or not, over the folder's Normalize module "
                        "(default: normalised)")
    p.add_argument("--dtype", default=None, help="float32 | bfloat16 | float16 | auto")
    p.add_argument("--load-format", default=None, help="auto | dummy")
    p.add_argument("--kv-cache-gb", type=float, default=None)
    p.add_argument("--device", default=None, help="cpu | cuda:N")
    p.add_argument("--max-num-seqs", type=int, default=None)
    p.add_argument("--max-num-batched-tokens", type=int, default=None)
    p.add_argument("--preemption", default=None, choices=PREEMPTION_MODES)
    p.add_argument("--scheduling-policy", default=None, choices=SCHEDULING_POLICIES,
                   help="priority: lower priority values first; batch jobs yield to interactive requests")
    p.add_argument("--routing", default=None, choices=ROUTING_MODES, help=ROUTING_HELP)
    p.add_argument("--enforce-eager", action=argparse.BooleanOptionalAction, default=None,
                   help="run the model op by op instead of the compiled step (faster start-up)")
    p.add_argument("--max-cudagraph-capture-size", type=int, default=None,
                   help="CUDA: graphs of the compiled step for decode batches up to this size (default 512; 0: none)")
    p.add_argument("--gpu-memory-utilization", type=float, default=None,
                   help="CUDA: the fraction of the device's memory each worker may fill (default 0.9); "
                        "two replicas on one GPU take 0.45 each")
    p.add_argument("--generation-config", default=None, metavar="auto|vllm|FOLDER",
                   help="sampling defaults for requests that leave them unset: auto (default), the model "
                        "folder's generation_config.json; vllm, none; or another folder's")
    p.add_argument("--compile-cache-dir", default=None,
                   help="where compiled graphs persist across starts (default ~/.cache/stepserve)")
    p.add_argument("--curve-keys", default=None, metavar="DIR",
                   help="CurveZMQ on every link, with the keys of `stepserve keys generate DIR` "
                        "(default: $STEPSERVE_CURVE_KEYS)")
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None,
                   help="share the KV of common prompt prefixes (default: on for attention models)")
    p.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=None,
                   help="plan each step while the worker runs the one before (default: on)")
    p.add_argument("--worker-timeout", type=float, default=None, metavar="S",
                   help="seconds a worker may be silent before its replica is dropped, its requests moved "
                        "to the others, until it says hello again (default 10; docs/operations.md)")
    p.add_argument("--step-timeout", type=float, default=None, metavar="S",
                   help="seconds one step may go unanswered by a worker that still sends heartbeats (a hung "
                        "kernel) before its replica is dropped like a silent one (default 300)")


# Which process takes each option of a local cluster: the flag is the option's name with dashes.
# Options left None take that process's own default; booleans become --name / --no-name.
_SCHEDULER_OPTIONS = ("max_num_seqs", "max_num_batched_tokens", "preemption", "scheduling_policy", "routing",
                      "enable_prefix_caching", "async_scheduling", "worker_timeout",
                      "step_timeout")
_WORKER_OPTIONS = ("revision", "download_dir", "dtype", "load_format", "kv_cache_gb", "max_model_len",
                   "gpu_memory_utilization", "swap_space_gb", "device", "block_size", "enforce_eager",
                   "compile_cache_dir", "generation_config", "max_cudagraph_capture_size", "task",
                   "pooling_type", "normalize")


def child_args(**options) -> tuple[list[str], list[str]]:
    """The scheduler's and the workers' command lines for these options (the one place the
    launcher's callers, `stepserve` and `LLM`, turn options into flags)."""
    unknown = set(options) - set(_SCHEDULER_OPTIONS) - set(_WORKER_OPTIONS)
    assert not unknown, f"no process takes {sorted(unknown)}"
    lines = ([], [])
    for names, line in zip((_SCHEDULER_OPTIONS, _WORKER_OPTIONS), lines):
        for name in names:
            value = options.get(name)
            flag = "--" + name.replace("_", "-")
            if isinstance(value, bool):
                line.append(flag if value else "--no-" + flag[2:])
            elif value is not None:
                line += [flag, str(value)]
    return lines


def cluster_args(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """Splits the cluster flags into the scheduler's and the workers' command lines."""
    names = (*_SCHEDULER_OPTIONS, *_WORKER_OPTIONS)
    return child_args(**{name: getattr(args, name) for name in names if hasattr(args, name)})


@contextlib.contextmanager
def service_address(args: argparse.Namespace) -> Iterator[str]:
    """--address if given; otherwise a local cluster started from the flags, stopped on exit."""
    if args.address is not None:
        yield args.address
        return
    scheduler, worker = cluster_args(args)
    with LocalCluster(args.model, args.data_parallel_size, scheduler_args=scheduler, worker_args=worker,
                      tensor_parallel_size=args.tensor_parallel_size, curve_keys=args.curve_keys,
                      announce=True) as cluster:
        yield cluster.address
