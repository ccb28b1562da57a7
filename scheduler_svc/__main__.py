"""python -m scheduler_svc --frontend tcp://127.0.0.1:5555 --worker-address tcp://127.0.0.1:5556
[--curve-secret-key FILE --curve-authorized-keys DIR] [--max-queued-requests N] [--drain-timeout-s S]"""
import argparse
import asyncio
import logging
import signal
import sys


from protocol import event_loop
from scheduler_svc.admission import DEFAULT_MAX_QUEUED_REQUESTS
from scheduler_svc.auth import FrontDoor
from scheduler_svc.config import PREEMPTION_MODES, ROUTING_HELP, ROUTING_MODES, SCHEDULING_POLICIES, SchedulerConfig
from scheduler_svc.gc_tuning import tune_gc_for_large_queues
from scheduler_svc.service import SchedulerService


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m scheduler_svc", description="stepserve scheduler")
    p.add_argument("--frontend", default="tcp://127.0.0.1:5555", help="address clients connect to")
    p.add_argument("--worker-address", default="tcp://127.0.0.1:5556", help="address workers connect to")
    p.add_argument("--max-num-seqs", type=int, default=SchedulerConfig.max_num_seqs)
    p.add_argument("--max-num-batched-tokens", type=int, default=SchedulerConfig.max_num_batched_tokens)
    p.add_argument("--preemption", choices=PREEMPTION_MODES, default=SchedulerConfig.preemption_mode)
    p.add_argument("--scheduling-policy", choices=SCHEDULING_POLICIES, default=SchedulerConfig.policy,
                   help="priority: lower priority values first, ties by arrival, and a waiting request may "
                        "preempt a running one of a higher value (vLLM's --scheduling-policy)")
    p.add_argument("--routing", choices=ROUTING_MODES, default=SchedulerConfig.routing, help=ROUTING_HELP)
    p.add_argument("--no-chunked-prefill", action="store_true")
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction,
                   default=SchedulerConfig.enable_prefix_caching,
                   help="share the KV of common prompt prefixes (attention models; off for state models)")
    p.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction,
                   default=SchedulerConfig.async_scheduling,
                   help="plan each step while the worker runs the one before (two plans in flight; default: on)")
    p.add_argument("--worker-timeout", type=float, default=10.0,
                   help="seconds of silence after which a worker is dropped and its requests requeued")
    p.add_argument("--step-timeout", type=float, default=300.0,
                   help="seconds a step may go unanswered by a worker that still sends heartbeats (a hung "
                        "kernel) before it is dropped and its requests requeued, as a silent one is")
    p.add_argument("--max-message-mb", type=int, default=256, help="largest incoming message accepted")
    p.add_argument("--metrics-port", type=int, default=None,
                   help="serve Prometheus metrics on this port (0: any free one); off by default")
    p.add_argument("--metrics-host", default="127.0.0.1", help="address the metrics endpoint binds")
    p.add_argument("--curve-secret-key", default=None, metavar="FILE",
                   help="the scheduler's secret certificate (pyzmq format, `stepserve keys generate`): CurveZMQ "
                        "on both sockets")
    p.add_argument("--curve-authorized-keys", default=None, metavar="DIR",
                   help="folder of the public certificates accepted (clients and workers); others are refused")
    p.add_argument("--max-queued-requests", type=int, default=DEFAULT_MAX_QUEUED_REQUESTS,
                   help="requests held (waiting or running) beyond which new ones get an 'overloaded' error")
    p.add_argument("--drain-timeout-s", type=float, default=30.0,
                   help="on SIGTERM: how long queued and running requests may take to finish before they fail")
    p.add_argument("--log-level", default="INFO")
    return p.parse_args(argv)


async def run(args: argparse.Namespace) -> None:
    config = SchedulerConfig(max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
                             preemption_mode=args.preemption, policy=args.scheduling_policy,
                             enable_chunked_prefill=not args.no_chunked_prefill,
                             enable_prefix_caching=args.enable_prefix_caching,
                             async_scheduling=args.async_scheduling, routing=args.routing)
    service = SchedulerService(args.frontend, args.worker_address, config, worker_timeout_s=args.worker_timeout,
                               step_timeout_s=args.step_timeout,
                               max_message_bytes=args.max_message_mb << 20,
                               enable_metrics=args.metrics_port is not None,
                               max_queued_requests=args.max_queued_requests, drain_timeout_s=args.drain_timeout_s,
                               front_door=FrontDoor(args.curve_secret_key, args.curve_authorized_keys))
    metrics = ""
    if service.metrics is not None:
        metrics = f" metrics=http://{args.metrics_host}:{service.metrics.serve(args.metrics_host, args.metrics_port)}"
    frontend, workers = service.bind()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, service.drain.begin)  # a second signal: at once
    # The launcher waits for this line; it carries the bound addresses (ports may be '*').
    print(f"stepserve scheduler ready frontend={frontend} workers={workers}{metrics}", flush=True)
    await service.serve()


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    tune_gc_for_large_queues()
    event_loop.run(run(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
