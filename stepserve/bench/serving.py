"""Online serving benchmark, like `vllm bench serve`: requests arrive as a Poisson process (or
all at once), each streams its tokens, and the latencies users see are measured.

Against a gateway over HTTP (--base-url, OpenAI's /v1/completions with stream=true), or a
scheduler through the SDK (--address); with neither, a local cluster and gateway are started.
Random prompts of --input-len token ids, exactly --output-len tokens each (ignore_eos); no
temperature is sent unless --temperature gives one (0: greedy), so the server's default, as
`vllm bench serve` does.

    stepserve bench serve --base-url http://127.0.0.1:8000 --request-rate 50 --num-prompts 500
    stepserve bench serve --address tcp://127.0.0.1:5555 --request-rate inf --json out.json
"""
import argparse
import asyncio
import contextlib
import json
import time
from dataclasses import dataclass, field

import msgspec
import numpy as np

from client_sdk.client import AsyncClient
from protocol.sampling import SamplingParams
from stepserve.bench.throughput import random_prompts
from stepserve.cluster_args import cluster_args
from stepserve.launcher import LocalCluster


def add_serving_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base-url", default=None, help="a gateway, e.g. http://127.0.0.1:8000")
    p.add_argument("--address", default=None, help="a scheduler's frontend, through the SDK")
    p.add_argument("--served-model-name", default=None, help="the model name sent over HTTP (default: the server's)")
    p.add_argument("--num-prompts", type=int, default=200)
    p.add_argument("--input-len", type=int, default=16)
    p.add_argument("--output-len", type=int, default=16)
    p.add_argument("--request-rate", type=float, default=float("inf"), help="requests/s, Poisson; inf: all at once")
    p.add_argument("--max-concurrency", type=int, default=None, help="bound on requests in flight")
    p.add_argument("--temperature", type=float, default=None,
                   help="sent with every request (0: greedy); default: none, the server's default")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", nargs="?", const="-", default=None, metavar="PATH",
                   help="write the result as JSON to PATH (to stdout without PATH)")


@dataclass
class RequestResult:
    ok: bool = False
    ttft: float = 0.0
    latency: float = 0.0
    itls: list[float] = field(default_factory=list)
    num_output_tokens: int = 0
    error: str = ""


async def _sdk_request(client: AsyncClient, prompt: list[int], params: SamplingParams) -> RequestResult:
    result, start = RequestResult(), time.perf_counter()
    last = start
    try:
        async for delta in client.stream(prompt, params):
            now = time.perf_counter()
            if delta.token_ids:
                if result.num_output_tokens == 0:
                    result.ttft = now - start
                else:
                    result.itls.append(now - last)
                last = now
                result.num_output_tokens += len(delta.token_ids)
        result.ok = True
    except Exception as e:
        result.error = f"{type(e).__name__}: {e}"
    result.latency = time.perf_counter() - start
    return result


async def _http_request(session, url: str, model: str | None, prompt: list[int], params: SamplingParams,
                        temperature: float | None) -> RequestResult:
    body = {"prompt": prompt, "max_tokens": params.max_tokens, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    if temperature is not None:
        body["temperature"] = temperature
    if model:
        body["model"] = model
    result, start = RequestResult(), time.perf_counter()
    last, num_chunks = start, 0
    try:
        async with session.post(url, json=body) as response:
            if response.status != 200:
                raise RuntimeError(f"HTTP {response.status}: {await response.text()}")
            async for line in response.content:
                if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                    continue
                now = time.perf_counter()
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    result.num_output_tokens = chunk["usage"]["completion_tokens"]
                if not chunk.get("choices"):
                    continue
                if num_chunks == 0:  # each chunk is one step's delta: its tokens arrived now
                    result.ttft = now - start
                else:
                    result.itls.append(now - last)
                last, num_chunks = now, num_chunks + 1
        result.ok = True
    except Exception as e:
        result.error = f"{type(e).__name__}: {e}"
    result.latency = time.perf_counter() - start
    return result


async def _arrivals(num: int, rate: float, seed: int):
    """Yields once per request, at Poisson arrival times (all at once when rate is inf)."""
    rng = np.random.default_rng(seed)
    for _ in range(num):
        yield
        if rate != float("inf"):
            await asyncio.sleep(rng.exponential(1.0 / rate))


async def run_load(send, prompts: list[list[int]], args: argparse.Namespace) -> tuple[list[RequestResult], float]:
    """send(prompt) -> RequestResult; returns the results and the wall time of the whole load."""
    limit = asyncio.Semaphore(args.max_concurrency) if args.max_concurrency else contextlib.nullcontext()

    async def one(prompt):
        async with limit:
            return await send(prompt)

    start = time.perf_counter()
    tasks = []
    i = 0
    async for _ in _arrivals(len(prompts), args.request_rate, args.seed):
        tasks.append(asyncio.ensure_future(one(prompts[i])))
        i += 1
    results = await asyncio.gather(*tasks)
    return results, time.perf_counter() - start


def summarize(results: list[RequestResult], duration: float, args: argparse.Namespace) -> dict:
    good = [r for r in results if r.ok]
    ms = lambda xs: np.asarray(xs, dtype=float) * 1000.0  # noqa: E731
    ttft = ms([r.ttft for r in good])
    tpot = ms([(r.latency - r.ttft) / (r.num_output_tokens - 1) for r in good if r.num_output_tokens > 1])
    itl = ms([x for r in good for x in r.itls])
    e2e = ms([r.latency for r in good])
    num_out = sum(r.num_output_tokens for r in good)
    stats = lambda name, xs: {f"mean_{name}_ms": float(xs.mean()) if xs.size else 0.0,  # noqa: E731
                              f"median_{name}_ms": float(np.median(xs)) if xs.size else 0.0,
                              f"p99_{name}_ms": float(np.percentile(xs, 99)) if xs.size else 0.0}
    return {"completed": len(good), "failed": len(results) - len(good),
            "errors": sorted({r.error for r in results if not r.ok})[:3],
            "duration_s": duration, "request_rate": args.request_rate, "max_concurrency": args.max_concurrency,
            "request_throughput": len(good) / duration, "output_throughput": num_out / duration,
            "total_token_throughput": (num_out + len(good) * args.input_len) / duration,
            **stats("ttft", ttft), **stats("tpot", tpot), **stats("itl", itl), **stats("e2el", e2e)}


async def measure(args: argparse.Namespace, base_url: str | None, address: str | None) -> dict:
    """One load against a gateway (base_url) or a scheduler (address)."""
    async with AsyncClient(address, timeout_s=60) if address else contextlib.nullcontext() as client:
        params = SamplingParams(max_tokens=args.output_len, ignore_eos=True)
        if args.temperature is not None:
            params = msgspec.structs.replace(params, temperature=args.temperature)
        if base_url:
            import aiohttp
            vocab_size, avoid = await _http_model(base_url)
            prompts = random_prompts(args.num_prompts, args.input_len, vocab_size, args.seed, avoid)
            connector = aiohttp.TCPConnector(limit=0)
            timeout = aiohttp.ClientTimeout(total=6 * 3600)
            async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
                url = base_url.rstrip("/") + "/v1/completions"
                send = lambda p: _http_request(session, url, args.served_model_name, p, params,  # noqa: E731
                                               args.temperature)
                await asyncio.gather(*(send(p) for p in prompts[:4]))  # warm-up, not timed
                results, duration = await run_load(send, prompts, args)
        else:
            await client.wait_for_workers(1, timeout_s=600)
            info = await client.model_info()
            prompts = random_prompts(args.num_prompts, args.input_len, info.vocab_size, args.seed,
                                     set(info.eos_token_ids) | {0, 1, 2, 3})
            send = lambda p: _sdk_request(client, p, params)  # noqa: E731
            await asyncio.gather(*(send(p) for p in prompts[:4]))  # warm-up, not timed
            results, duration = await run_load(send, prompts, args)
    result = summarize(results, duration, args)
    result["backend"] = "http" if base_url else "sdk"
    return result


async def _http_model(base_url: str) -> tuple[int, set[int]]:
    """The vocabulary to draw prompts from: HTTP says no vocab size, so ask the model card."""
    import aiohttp
    async with aiohttp.ClientSession() as session:
        async with session.get(base_url.rstrip("/") + "/v1/models") as response:
            card = (await response.json())["data"][0]
    return int(card.get("vocab_size") or 256), {0, 1, 2, 3}


def print_result(result: dict) -> None:
    print("{s:{c}^50}".format(s=f" Serving Benchmark Result ({result['backend']}) ", c="="))
    rows = [("Successful requests:", result["completed"]), ("Failed requests:", result["failed"]),
            ("Benchmark duration (s):", f"{result['duration_s']:.2f}"),
            ("Request throughput (req/s):", f"{result['request_throughput']:.2f}"),
            ("Output token throughput (tok/s):", f"{result['output_throughput']:.2f}")]
    for name, label in (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL")):
        for kind in ("mean", "median", "p99"):
            rows.append((f"{kind.capitalize() if kind != 'p99' else 'P99'} {label} (ms):",
                         f"{result[f'{kind}_{name}_ms']:.2f}"))
    for label, value in rows:
        print(f"{label:<40}{value:>10}")
    print("=" * 50, flush=True)


async def run_serving(args: argparse.Namespace) -> int:
    if args.base_url or args.address:
        result = await measure(args, args.base_url, None if args.base_url else args.address)
    else:
        scheduler, worker = cluster_args(args)
        with LocalCluster(args.model, args.data_parallel_size, scheduler_args=scheduler, worker_args=worker,
                          tensor_parallel_size=args.tensor_parallel_size, announce=True) as cluster:
            base_url = cluster.start_gateway()
            result = await measure(args, base_url, None)
    result["config"] = {k: v for k, v in vars(args).items() if k != "func" and not callable(v)}
    print_result(result)
    if args.json == "-":
        print(json.dumps(result), flush=True)
    elif args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0 if result["failed"] == 0 else 1

