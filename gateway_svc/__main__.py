"""python -m gateway_svc --scheduler tcp://127.0.0.1:5555 --host 127.0.0.1 --port 8000 [--reuse-port]
[--api-key KEY] [--served-model-name NAME] [--max-num-requests N] [--batch-dir DIR]
[--max-request-body-bytes N] [--max-prompts-per-request N]
[--enable-auto-tool-choice] [--tool-call-parser NAME] [--reasoning-parser NAME]
[--curve-server-key FILE --curve-secret-key FILE]  (CurveZMQ to the scheduler; or the SDK's variables)"""
import argparse
import asyncio
import contextlib
import logging
import os
import socket
import sqlite3
import sys

import uvicorn

from protocol import event_loop
from client_sdk.client import AsyncClient
from client_sdk.batch import DEFAULT_BATCH_WINDOW
from gateway_svc.app import create_app
from gateway_svc.batch_jobs import BatchJobs
from gateway_svc.batch_store import BatchStore, default_batch_dir
from gateway_svc.chat_parsing import add_chat_parsing_flags, chat_parsing_of
from gateway_svc.request_limits import DEFAULT_MAX_PROMPTS_PER_REQUEST, DEFAULT_MAX_REQUEST_BODY_BYTES, RequestLimits
from gateway_svc.upstream import Upstream


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m gateway_svc", description="stepserve OpenAI-compatible HTTP gateway")
    p.add_argument("--scheduler", default="tcp://127.0.0.1:5555", help="the scheduler's frontend address")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="0: any free port (printed on the ready line)")
    p.add_argument("--reuse-port", action="store_true",
                   help="bind with SO_REUSEPORT, so that several gateways share --port (the kernel spreads the "
                        "connections over them): `stepserve serve --api-server-count N`")
    p.add_argument("--api-key", default=os.environ.get("STEPSERVE_API_KEY") or None,
                   help="required as 'Authorization: Bearer KEY' on /v1/* (default: $STEPSERVE_API_KEY)")
    p.add_argument("--served-model-name", default=None, help="the model's name in the API (default: the model's)")
    p.add_argument("--max-num-requests", type=int, default=0,
                   help="requests in flight through this gateway beyond which it answers 503 (0: no bound)")
    p.add_argument("--max-request-body-bytes", type=int, default=DEFAULT_MAX_REQUEST_BODY_BYTES,
                   help="a larger request body is refused with 413 before it is read (0: no bound; the default, "
                        "32 MiB, holds the longest prompt the protocol takes, 2^20 token ids, four times over; a "
                        "batch file upload, spooled to disk, may have 200 MiB)")
    p.add_argument("--max-prompts-per-request", type=int, default=DEFAULT_MAX_PROMPTS_PER_REQUEST,
                   help="more prompts in one /v1/completions request get a 400")
    p.add_argument("--scheduler-timeout", type=float, default=10.0,
                   help="seconds to wait for the scheduler's health or model info before answering 503")
    p.add_argument("--curve-server-key", default=None, metavar="FILE",
                   help="the scheduler's public certificate (default: $STEPSERVE_CURVE_SERVER_KEY)")
    p.add_argument("--curve-secret-key", default=None, metavar="FILE",
                   help="the gateway's secret certificate, a client's (default: $STEPSERVE_CURVE_SECRET_KEY)")
    p.add_argument("--batch-dir", default=None,
                   help=f"the Batch API's state and files (default: {default_batch_dir()}); gateways may share one "
                        "on a local filesystem: each batch is run by one of them at a time")
    p.add_argument("--batch-window", type=int, default=DEFAULT_BATCH_WINDOW,
                   help="a batch's requests in flight at most")
    add_chat_parsing_flags(p)
    p.add_argument("--log-level", default="WARNING")
    args = p.parse_args(argv)
    try:
        args.chat_parsing = chat_parsing_of(args)
    except ValueError as e:
        p.error(str(e))
    return args


def _batch_store(batch_dir: str | None) -> BatchStore | None:
    """The Batch API's store; without --batch-dir, a default folder that cannot be made leaves
    the gateway serving without the Batch API (a warning), not failing to start."""
    try:
        return BatchStore(batch_dir or default_batch_dir())
    except (OSError, sqlite3.Error) as e:
        if batch_dir is not None:
            raise
        logging.getLogger("stepserve.gateway").warning("no Batch API: %s (give --batch-dir)", e)
        return None


def _shared_socket(host: str, port: int) -> socket.socket:
    """A listening address that other gateways may bind too (SO_REUSEPORT)."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(address)
    return sock


async def serve(args: argparse.Namespace) -> None:
    client = AsyncClient(args.scheduler, timeout_s=args.scheduler_timeout, curve_server_key=args.curve_server_key,
                         curve_secret_key=args.curve_secret_key)
    upstream = Upstream(client, args.served_model_name, args.max_num_requests,
                        RequestLimits(args.max_request_body_bytes, args.max_prompts_per_request), args.chat_parsing)
    store = _batch_store(args.batch_dir)
    jobs = asyncio.ensure_future(BatchJobs(store, upstream, args.batch_window).run_forever()) if store else None
    config = uvicorn.Config(create_app(upstream, args.api_key, store), host=args.host, port=args.port, loop="none",
                            http="auto", log_level=args.log_level.lower(), access_log=False,
                            timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)
    serving = asyncio.ensure_future(server.serve(sockets=[_shared_socket(args.host, args.port)] if args.reuse_port
                                                 else None))
    while not server.started and not serving.done():
        await asyncio.sleep(0.01)
    if server.started:
        host, port = server.servers[0].sockets[0].getsockname()[:2]
        # The launcher waits for this line; it carries the bound port (--port may be 0).
        print(f"stepserve gateway ready url=http://{host}:{port}", flush=True)
    try:
        await serving
    finally:
        if jobs is not None:
            jobs.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await jobs
            store.close()
        await client.close()


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    event_loop.run(serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
