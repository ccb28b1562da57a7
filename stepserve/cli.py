"""The `stepserve` command: `up`, `serve`, `generate`, `run-batch`, `health`, `keys generate`,
`bench throughput`, `bench serve`."""
import argparse
import asyncio
import signal
import socket
import sys
import threading

from client_sdk import __version__
from client_sdk.batch import DEFAULT_BATCH_WINDOW
from client_sdk.sync_client import Client
from gateway_svc.chat_parsing import add_chat_parsing_flags, chat_parsing_flags, chat_parsing_of
from protocol import event_loop
from protocol.client_messages import BATCH_PRIORITY
from protocol.curve import generate_keys
from protocol.sampling import SamplingParams
from stepserve.cluster_args import add_cluster_flags, cluster_args, service_address
from stepserve.launcher import LocalCluster, MissingExtra, ProcessExited


def _run_until_stopped(cluster: LocalCluster, start_gateway=None) -> int:
    """Starts the cluster (and, if given, the gateway), prints the ready line, serves until
    Ctrl-C or SIGTERM, then stops every process it started."""
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    cluster.start()
    try:
        url = start_gateway() if start_gateway else None
        where = f"OpenAI API at {url}/v1 (SDK: {cluster.address})" if url else f"clients connect to {cluster.address}"
        print(f"stepserve {'serve' if url else 'up'}: {cluster.model} on {cluster.data_parallel_size} replica(s) of "
              f"{cluster.tensor_parallel_size} worker(s); {where}", flush=True)
        while not stop.wait(0.5):
            exited = cluster.service_exited()
            if exited:
                print(f"{exited} exited", file=sys.stderr)
                return 1
    finally:
        cluster.stop()
    return 0


def _cluster(args: argparse.Namespace) -> LocalCluster:
    scheduler, worker = cluster_args(args)
    # On Ray the replicas are placed over the cluster's nodes: as many as asked, one by default.
    replicas = (args.data_parallel_size or 1) if args.ray else args.data_parallel_size
    cluster = LocalCluster(args.model, replicas, scheduler_args=scheduler, worker_args=worker,
                           frontend=args.frontend, worker_address=args.worker_address, quiet=False,
                           tensor_parallel_size=args.tensor_parallel_size, curve_keys=args.curve_keys, announce=True)
    if args.ray:
        try:
            from stepserve.ray_cluster import RayCluster  # Ray is an extra: imported when asked for
        except ModuleNotFoundError as e:
            raise MissingExtra(f"--ray needs Ray ({e.name}), which this Python lacks: "
                               "pip install 'stepserve[ray]'", name=e.name) from None
        return RayCluster(cluster, ray_address=args.ray_address, num_cpus_per_worker=args.ray_num_cpus_per_worker)
    return cluster


def cmd_up(args: argparse.Namespace) -> int:
    return _run_until_stopped(_cluster(args))


def cmd_serve(args: argparse.Namespace) -> int:
    cluster = _cluster(args)
    gateway_args = []
    for flag, value in (("--api-key", args.api_key), ("--served-model-name", args.served_model_name),
                        ("--max-num-requests", args.max_num_requests), ("--batch-dir", args.batch_dir)):
        if value:
            gateway_args += [flag, str(value)]
    for flag, value in (("--max-request-body-bytes", args.max_request_body_bytes),
                        ("--max-prompts-per-request", args.max_prompts_per_request)):
        if value is not None:  # 0 means no bound
            gateway_args += [flag, str(value)]
    if args.api_server_count > 1:
        gateway_args.append("--reuse-port")
    gateway_args += chat_parsing_flags(args)

    def start_gateways() -> str:
        """The first gateway on --port; the others on the port it bound (--port may be 0)."""
        url = cluster.start_gateway(gateway_args, host=args.host, port=args.port)
        for _ in range(args.api_server_count - 1):
            cluster.start_gateway(gateway_args, host=args.host, port=int(url.rsplit(":", 1)[1]))
        return url

    return _run_until_stopped(cluster, start_gateways)


def cmd_health(args: argparse.Namespace) -> int:
    """Exit status 0 when the scheduler answers (and, with --worker-on-this-host, when a worker
    of this host has joined it): for container healthchecks."""
    try:
        with Client(args.address, timeout_s=args.timeout) as client:
            health = client.health()
    except Exception as e:
        print(f"unhealthy: {e}", file=sys.stderr)
        return 1
    if args.worker_on_this_host:
        host = socket.gethostname()
        if not any(r.name.startswith(host + "/") for r in health.replicas):
            print(f"unhealthy: no worker of {host} has joined {args.address}", file=sys.stderr)
            return 1
    print(f"ok: {health.num_workers} worker(s), {health.num_running} running, {health.num_waiting} waiting")
    return 0


def cmd_keys_generate(args: argparse.Namespace) -> int:
    for path in generate_keys(args.directory):
        print(path)
    print(f"scheduler: --curve-secret-key {args.directory}/scheduler.key_secret "
          f"--curve-authorized-keys {args.directory}/authorized\n"
          f"workers:   --curve-server-key {args.directory}/scheduler.key --curve-secret-key "
          f"{args.directory}/worker.key_secret\n"
          f"clients:   curve_server_key={args.directory}/scheduler.key curve_secret_key="
          f"{args.directory}/client.key_secret  (or STEPSERVE_CURVE_KEYS={args.directory} for all of them)")
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                            top_k=args.top_k, seed=args.seed, ignore_eos=args.ignore_eos)
    keys = {}
    if args.curve_keys:  # the local cluster's keys (a running service: the SDK's variables)
        keys = {"curve_server_key": f"{args.curve_keys}/scheduler.key",
                "curve_secret_key": f"{args.curve_keys}/client.key_secret"}
    with service_address(args) as address, Client(address, **keys) as client:
        client.wait_for_workers(1, timeout_s=600)
        for prompt in args.prompts:
            if args.stream:
                for delta in client.stream(prompt, params):
                    print(delta.text if delta.text is not None else delta.token_ids, end="", flush=True)
                print()
            else:
                out = client.generate(prompt, params).outputs[0]
                print(out.text if out.text is not None else out.token_ids)
    return 0


def cmd_run_batch(args: argparse.Namespace) -> int:
    try:
        from gateway_svc.run_batch import run
    except ModuleNotFoundError as e:  # a client-only install
        raise MissingExtra(f"stepserve run-batch reads requests as the HTTP gateway does, which needs {e.name}: "
                           "pip install 'stepserve[server]'") from None
    with service_address(args) as address:
        return event_loop.run(run(args, address))


def cmd_models(args: argparse.Namespace) -> int:
    from worker_svc import presets
    from worker_svc.models import ROPE_TYPES, supported_architectures
    print("architectures (config.json's \"architectures\"):")
    for name in supported_architectures():
        print(f"  {name}")
    print(f"RoPE types (rope_parameters / rope_scaling \"rope_type\"): {', '.join(ROPE_TYPES)}")
    print(f"presets (random weights, no download): {', '.join(sorted(presets.PRESETS))}")
    return 0


def add_worker_address_flag(p: argparse.ArgumentParser, default: str) -> None:
    p.add_argument("--worker-address", default=default, help="the scheduler's address for its workers")


def add_ray_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ray", action="store_true",
                   help="place the scheduler (and gateway) on the Ray head node and each replica as a Ray actor "
                        "spread over the nodes; needs the ray extra")
    p.add_argument("--ray-address", default=None,
                   help="a running Ray cluster (auto, HOST:PORT, ray://HOST:10001); default: $RAY_ADDRESS, else a "
                        "local Ray started for this command")
    p.add_argument("--ray-num-cpus-per-worker", type=float, default=1.0,
                   help="Ray CPUs each worker process takes (and its torch threads on a CPU)")


def _add_up(sub) -> None:
    up = sub.add_parser("up", help="start a scheduler and N workers here; Ctrl-C stops all")
    add_cluster_flags(up)
    up.add_argument("--frontend", default="tcp://127.0.0.1:5555")
    add_worker_address_flag(up, "tcp://127.0.0.1:5556")
    add_ray_flags(up)
    up.set_defaults(func=cmd_up)


def _add_serve(sub) -> None:
    serve = sub.add_parser("serve", help="scheduler, workers and an OpenAI-compatible gateway here; Ctrl-C stops all")
    add_cluster_flags(serve)
    serve.add_argument("--host", default="127.0.0.1", help="the gateway's address")
    serve.add_argument("--port", type=int, default=8000, help="the gateway's port (0: any free one)")
    serve.add_argument("--api-server-count", type=int, default=1,
                       help="gateway processes sharing --port (vLLM's name): on a host with cores to spare, more "
                            "HTTP work in parallel; each one's /metrics counts the requests it served")
    serve.add_argument("--api-key", default=None)
    serve.add_argument("--served-model-name", default=None)
    serve.add_argument("--max-num-requests", type=int, default=0)
    serve.add_argument("--max-request-body-bytes", type=int, default=None,
                       help="a larger request body gets a 413 before it is read (default: the gateway's, 32 MiB)")
    serve.add_argument("--max-prompts-per-request", type=int, default=None,
                       help="more prompts in one /v1/completions request get a 400 (default: the gateway's, 1024)")
    serve.add_argument("--batch-dir", default=None,
                       help="the Batch API's state and files (default: under the user's data directory)")
    serve.add_argument("--frontend", default="tcp://127.0.0.1:*", help="the scheduler's SDK address")
    add_worker_address_flag(serve, "tcp://127.0.0.1:*")
    add_chat_parsing_flags(serve)
    add_ray_flags(serve)
    serve.set_defaults(func=cmd_serve)


def _add_health(sub) -> None:
    health = sub.add_parser("health", help="exit 0 when a scheduler answers (container healthchecks)")
    health.add_argument("--address", default="tcp://127.0.0.1:5555")
    health.add_argument("--timeout", type=float, default=5.0)
    health.add_argument("--worker-on-this-host", action="store_true",
                        help="and a worker started on this host (its default worker id) has joined")
    health.set_defaults(func=cmd_health)


def _add_keys(sub) -> None:
    keys = sub.add_parser("keys", help="CurveZMQ keys")
    keys_sub = keys.add_subparsers(dest="keys", required=True)
    keys_generate = keys_sub.add_parser("generate", help="write key pairs for the scheduler, a client and a worker "
                                                         "(pyzmq certificates) and DIR/authorized/")
    keys_generate.add_argument("directory", metavar="DIR")
    keys_generate.set_defaults(func=cmd_keys_generate)


def _add_generate(sub) -> None:
    gen = sub.add_parser("generate", help="complete prompts, on a running service or a local one")
    add_cluster_flags(gen)
    gen.add_argument("prompts", nargs="+")
    gen.add_argument("--address", default=None, help="a running scheduler's frontend; else start one")
    gen.add_argument("--max-tokens", type=int, default=32)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--ignore-eos", action="store_true")
    gen.add_argument("--stream", action="store_true")
    gen.set_defaults(func=cmd_generate)


def _add_run_batch(sub) -> None:
    run_batch = sub.add_parser("run-batch", help="an OpenAI batch file (.jsonl) run to its output file, "
                                                 "like `vllm run-batch`; resumable")
    add_cluster_flags(run_batch)
    run_batch.add_argument("-i", "--input-file", required=True, help="OpenAI batch input (.jsonl, or .jsonl.gz)")
    run_batch.add_argument("-o", "--output-file", required=True,
                           help="where output lines are appended (.gz: compressed)")
    run_batch.add_argument("--resume", action="store_true",
                           help="keep the output file's lines and run only the input lines it lacks")
    run_batch.add_argument("--window", type=int, default=DEFAULT_BATCH_WINDOW, help="requests in flight at most")
    run_batch.add_argument("--priority", type=int, default=BATCH_PRIORITY,
                           help="the least priority value of the batch's requests (lower is served first; "
                                "interactive requests have 0)")
    run_batch.add_argument("--address", default=None,
                           help="a running scheduler's frontend; else start a local cluster")
    run_batch.add_argument("--served-model-name", default=None, help="the model's name in requests and responses")
    add_chat_parsing_flags(run_batch)
    run_batch.set_defaults(func=cmd_run_batch)


def _add_models(sub) -> None:
    models = sub.add_parser("models", help="the model architectures, RoPE types and presets a worker serves")
    models.set_defaults(func=cmd_models)


def _add_bench(sub) -> None:
    from stepserve.bench.serving import add_serving_args, run_serving
    from stepserve.bench.throughput import add_throughput_args, run_throughput
    bench = sub.add_parser("bench", help="benchmarks")
    bench_sub = bench.add_subparsers(dest="bench", required=True)
    throughput = bench_sub.add_parser("throughput", help="offline throughput, like `vllm bench throughput`")
    add_cluster_flags(throughput)
    add_throughput_args(throughput)
    throughput.set_defaults(func=lambda a: asyncio.run(run_throughput(a)))
    serving = bench_sub.add_parser("serve", help="online serving latency, like `vllm bench serve`")
    add_cluster_flags(serving)
    add_serving_args(serving)
    serving.set_defaults(func=lambda a: asyncio.run(run_serving(a)))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="stepserve", description="stepserve LLM inference server")
    parser.add_argument("--version", action="version", version=f"stepserve {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for add in (_add_up, _add_serve, _add_health, _add_keys, _add_generate, _add_run_batch, _add_models, _add_bench):
        add(sub)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if hasattr(args, "tool_call_parser"):
        try:
            chat_parsing_of(args)  # flags that do not go together fail here, not in the gateway
        except ValueError as e:
            parser.error(str(e))
    try:
        return args.func(args)
    except MissingExtra as e:  # a client-only install asked to run a worker or a gateway
        print(f"stepserve: {e}", file=sys.stderr)
        return 2
    except ProcessExited as e:  # a process of the local cluster died: its own reason, no traceback
        print(f"stepserve: {e}", file=sys.stderr)
        return 1
    except _model_unavailable() as e:  # a hub id that cannot be had here: its one line, no traceback
        print(f"stepserve: {e}", file=sys.stderr)
        return 1


def _model_unavailable() -> type[Exception]:
    """worker_svc.model_source's error. An except clause's class is looked up only when an
    exception reaches it, so the client commands (`health`, `generate --address`) still import
    no worker_svc."""
    from worker_svc.model_source import ModelUnavailable
    return ModelUnavailable


if __name__ == "__main__":
    sys.exit(main())
