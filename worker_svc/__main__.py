"""python -m worker_svc --scheduler tcp://127.0.0.1:5556 --model tiny-llama|PATH|ORG/NAME [--device cpu|cuda:N]
[--revision REV] [--download-dir DIR]  (a Hugging Face hub id: fetched here, into the hub's cache)
[--dtype ...] [--load-format auto|dummy] [--kv-cache-gb N]
[--task auto|generate|embed|classify] [--pooling-type CLS|MEAN|LAST] [--normalize|--no-normalize]
[--tensor-parallel-size N --rank R --dist-init-address tcp://HOST:PORT [--group-id ID]]
[--devices all]  (one worker process per visible CUDA device)
[--curve-server-key FILE --curve-secret-key FILE]  (CurveZMQ; or $STEPSERVE_CURVE_KEYS, a keys folder)"""
import argparse
import logging
import os
import signal
import socket
import sys
import uuid

from protocol import AuthenticationError
from protocol.curve import connecting_keys
from worker_svc.model_config import check_servable
from worker_svc.model_source import ModelUnavailable, resolve_model
from worker_svc.runner_config import add_cli_args, from_args


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m worker_svc", description="stepserve model worker")
    p.add_argument("--scheduler", default="tcp://127.0.0.1:5556", help="the scheduler's worker address")
    p.add_argument("--worker-id", default=None, help="unique id (default: host/pid/random)")
    p.add_argument("--heartbeat-interval", type=float, default=0.5)
    p.add_argument("--log-level", default="INFO")
    p.add_argument("--group-id", default=None,
                   help="tensor-parallel group id, the same on every rank (default: derived "
                        "from --dist-init-address)")
    p.add_argument("--devices", choices=["all"], default=None,
                   help="all: one worker process per visible CUDA device (data parallel); "
                        "one CPU worker when none is visible")
    p.add_argument("--curve-server-key", default=None, metavar="FILE",
                   help="the scheduler's public certificate: CurveZMQ (with --curve-secret-key)")
    p.add_argument("--curve-secret-key", default=None, metavar="FILE", help="this worker's secret certificate")
    p.add_argument("--drain-timeout-s", type=float, default=30.0,
                   help="on SIGTERM: at most this long serving the scheduler's last plans before leaving")
    add_cli_args(p)
    return p.parse_args(argv)


def main(argv=None) -> int:
    # Before torch loads OpenMP: threads that wait at a barrier sleep instead of spinning
    # (cpu_threads.py says why and what it measured); a value the user set stands.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        check_servable(resolve_model(args.model, args.revision, args.download_dir, args.load_format),
                       args.task, args.pooling_type, args.normalize)
    except (ModelUnavailable, ValueError) as e:
        raise SystemExit(str(e)) from None  # one line that says what to do; a traceback would bury it
    # Imported after the check: torch takes seconds to import (tens on a busy machine), and a
    # model this worker cannot serve must fail before that, with its reason.
    from worker_svc import devices, host_allocator
    from worker_svc.parallel import default_group_id
    from worker_svc.runner import ModelRunner
    from worker_svc.service import WorkerService
    if args.devices == "all":
        if args.tensor_parallel_size > 1:
            raise SystemExit("--devices all starts data-parallel replicas; "
                             "it does not combine with --tensor-parallel-size > 1")
        num_devices = devices.num_visible_cuda_devices()
        if num_devices:
            return devices.run_per_device(argv, num_devices, args.worker_id)
        args.device = "cpu"
    curve_keys = connecting_keys("worker", args.curve_server_key, args.curve_secret_key)  # before the model loads
    runner = ModelRunner(from_args(args))
    if runner.pooling is None and runner.device.type == "cpu":  # steps' activations, not the weights or KV cache
        host_allocator.install()
    worker_id = args.worker_id or f"{socket.gethostname()}/{os.getpid()}/{uuid.uuid4().hex[:6]}"
    group_id = ""
    if args.tensor_parallel_size > 1:
        group_id = args.group_id or default_group_id(args.dist_init_address)
    # Every rank says hello and heartbeats; only rank 0 answers steps.
    service = WorkerService(args.scheduler, runner, runner.hello(worker_id, group_id),
                            heartbeat_interval_s=args.heartbeat_interval,
                            answers=runner.tp.is_driver, curve_keys=curve_keys,
                            drain_timeout_s=args.drain_timeout_s)
    signal.signal(signal.SIGTERM, lambda *_: service.stop())
    signal.signal(signal.SIGINT, lambda *_: service.stop())
    try:
        service.serve()
    except AuthenticationError as e:
        logging.getLogger("stepserve.worker").error("AuthenticationError: %s", e)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
