"""Offline throughput, measured like vLLM's `vllm bench throughput`: random prompt ids, exactly
--output-len new tokens (ignore_eos; greedy unless --temperature says otherwise), every prompt
handed over at once, timed over the generation phase only (start-up and a small warm-up
excluded).

    stepserve bench throughput --model tiny-llama --num-prompts 10000 --input-len 16 --output-len 16 --json

The sampling flags are vLLM's: --temperature (default 0, greedy), --top-p, --top-k, --min-p; with
a temperature, --seed also seeds each request's sampling (seed + its index), so a sampled run
repeats token for token.

A pooling model (`--task embed`, or a BERT folder on --task auto) is measured the same way with
the SDK's embed(): --input-len ids per prompt, no output tokens (measure_embed).

--prefix-len N puts one shared prefix of N random tokens before every prompt's own --input-len
tokens (a system prompt, few-shot examples), the workload prefix caching is for. The warm-up
prompts are drawn apart from the timed ones, so the cache starts cold for the timed prompts.
"""
import argparse
import asyncio
import json
import statistics
import sys
import time

import msgspec
import numpy as np

from client_sdk.client import AsyncClient
from protocol.client_messages import ModelInfo
from protocol.sampling import SamplingParams
from stepserve.cluster_args import service_address


def add_throughput_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--num-prompts", type=int, default=1000)
    p.add_argument("--input-len", type=int, default=16)
    p.add_argument("--output-len", type=int, default=16)
    p.add_argument("--prefix-len", type=int, default=0,
                   help="a shared prefix of this many random tokens before each prompt's own --input-len")
    p.add_argument("--address", default=None, help="a running scheduler's frontend; else start a local one")
    p.add_argument("--window", type=int, default=None, help="bound on requests in flight (default: all at once)")
    p.add_argument("--seed", type=int, default=0,
                   help="the prompts' random seed; with --temperature > 0 also each request's sampling seed (+ index)")
    add_sampling_args(p)
    p.add_argument("--gemm-limit", default=None, metavar="PATH",
                   help="benchmarks/matmul_limit.py's JSON for this model: adds gemm_fraction, the requests/s "
                        "reached over those its measured GEMM rates allow, and roofline_fraction, over those "
                        "its GEMM rates and memory bandwidth allow")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy (the default)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0, help="0: off")
    p.add_argument("--min-p", type=float, default=0.0)


def sampling_flags(args: argparse.Namespace) -> list[str]:
    """The sampling flags of args, as a command line that repeats them."""
    return ["--temperature", str(args.temperature), "--top-p", str(args.top_p), "--top-k", str(args.top_k),
            "--min-p", str(args.min_p)]


def sampling_params(args: argparse.Namespace, num_prompts: int) -> list[SamplingParams]:
    params = SamplingParams(max_tokens=args.output_len, temperature=args.temperature, top_p=args.top_p,
                            top_k=args.top_k, min_p=args.min_p, ignore_eos=True)
    if args.temperature == 0:
        return [params] * num_prompts
    return [msgspec.structs.replace(params, seed=args.seed + i) for i in range(num_prompts)]


def random_prompts(num_prompts: int, input_len: int, vocab_size: int, seed: int, avoid: set[int],
                   prefix_len: int = 0) -> list[list[int]]:
    """Random token ids; with prefix_len, one shared random prefix before each prompt's own."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, vocab_size, size=(num_prompts, input_len))
    prefix = rng.integers(0, vocab_size, size=prefix_len)
    for special in avoid:  # keep special tokens (bos/eos/pad) out of the prompts
        replacement = (special + 7) % vocab_size if (special + 7) % vocab_size not in avoid else 4
        ids[ids == special] = replacement
        prefix[prefix == special] = replacement
    prefix = prefix.tolist()
    return [prefix + row for row in ids.tolist()]


async def measure(client: AsyncClient, info: ModelInfo, args: argparse.Namespace) -> dict:
    avoid = set(info.eos_token_ids) | {0, 1, 2, 3}
    prefix_len = args.prefix_len
    prompts = random_prompts(args.num_prompts, args.input_len, info.vocab_size, args.seed, avoid, prefix_len)
    params = sampling_params(args, args.num_prompts)
    warm_up = random_prompts(8, args.input_len + prefix_len, info.vocab_size, args.seed + 1_000_003, avoid)
    await client.generate_batch(warm_up, params[:len(warm_up)])  # not timed; shares no prefix with the timed prompts
    before = await client.health()
    start = time.perf_counter()
    # A progress bar (requests done, requests/s) on a terminal only: --json output stays clean.
    batch = asyncio.ensure_future(client.generate_batch(prompts, params, window=args.window,
                                                        progress=sys.stderr.isatty()))
    step_timing = await sample_step_timing(client, batch)
    outputs = await batch
    elapsed = time.perf_counter() - start
    bad = [o for o in outputs if len(o.outputs[0].token_ids) != args.output_len or not o.ok]
    if bad:
        raise RuntimeError(f"{len(bad)} outputs with the wrong length or an error, e.g. {bad[0]}")
    num_output_tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    num_prompt_tokens = args.num_prompts * (args.input_len + prefix_len)
    health = await client.health()
    return {
        "model": info.model,
        "num_prompts": args.num_prompts,
        "input_len": args.input_len,
        "prefix_len": prefix_len,
        "output_len": args.output_len,
        "sampling": {"temperature": args.temperature, "top_p": args.top_p, "top_k": args.top_k,
                     "min_p": args.min_p},
        "workers": health.num_workers,
        "replicas": len(health.replicas),
        "window": args.window,
        "elapsed_s": round(elapsed, 3),
        "requests_per_second": round(args.num_prompts / elapsed, 4),
        "tokens_per_second": round((num_prompt_tokens + num_output_tokens) / elapsed, 2),
        "output_tokens_per_second": round(num_output_tokens / elapsed, 2),
        "steps_per_s": health.steps_per_s,
        # Medians over health samples taken while the batch was at its fullest (worker 0).
        "mean_step_time_ms": step_timing[0],
        "worker_busy_fraction": step_timing[1],
        # Of the timed prompts' tokens looked up in the prefix cache, those found computed.
        "prefix_cache_queries": health.num_prefix_cache_queries - before.num_prefix_cache_queries,
        "prefix_cache_hits": health.num_prefix_cache_hits - before.num_prefix_cache_hits,
    }


async def measure_embed(client: AsyncClient, info: ModelInfo, args: argparse.Namespace) -> dict:
    """A pooling model's throughput (`--task embed`): the prompts embedded through the SDK's
    embed(), all handed over at once; the generate bench's keys where they mean the same."""
    avoid = set(info.eos_token_ids) | {0, 1, 2, 3}
    prompts = random_prompts(args.num_prompts, args.input_len, info.vocab_size, args.seed, avoid)
    warm_up = random_prompts(8, args.input_len, info.vocab_size, args.seed + 1_000_003, avoid)
    await client.embed(warm_up)
    start = time.perf_counter()
    batch = asyncio.ensure_future(client.embed(prompts))
    step_timing = await sample_step_timing(client, batch)
    outputs = await batch
    elapsed = time.perf_counter() - start
    bad = [o for o in outputs if len(o.outputs.embedding) != info.pooling.size]
    if len(outputs) != args.num_prompts or bad:
        raise RuntimeError(f"{len(outputs)} outputs for {args.num_prompts} prompts, {len(bad)} of the wrong size")
    num_prompt_tokens = sum(len(o.prompt_token_ids) for o in outputs)
    health = await client.health()
    return {
        "model": info.model,
        "task": info.pooling.task,
        "pooling_type": info.pooling.pooling_type,
        "embedding_size": info.pooling.size,
        "num_prompts": args.num_prompts,
        "input_len": args.input_len,
        "output_len": 0,
        "workers": health.num_workers,
        "replicas": len(health.replicas),
        "window": args.window,
        "elapsed_s": round(elapsed, 3),
        "requests_per_second": round(args.num_prompts / elapsed, 4),
        "tokens_per_second": round(num_prompt_tokens / elapsed, 2),
        "output_tokens_per_second": 0.0,
        "steps_per_s": health.steps_per_s,
        "mean_step_time_ms": step_timing[0],
        "worker_busy_fraction": step_timing[1],
    }


async def sample_step_timing(client: AsyncClient, batch: asyncio.Future) -> tuple[float, float]:
    """The first replica's mean step time and worker busy fraction, sampled twice a second
    while `batch` runs; the medians over the samples where its batch was fullest."""
    samples = []
    while not batch.done():
        await asyncio.wait([batch], timeout=0.5)
        replicas = (await client.health()).replicas
        if replicas and replicas[0].worker_busy_fraction:
            samples.append((replicas[0].num_running, replicas[0].mean_step_time_ms,
                            replicas[0].worker_busy_fraction))
    if not samples:
        return 0.0, 0.0
    fullest = max(s[0] for s in samples)
    full = [s for s in samples if s[0] == fullest]
    return statistics.median(s[1] for s in full), statistics.median(s[2] for s in full)


def limit_fractions(result: dict, args: argparse.Namespace) -> dict:
    """gemm_fraction, and where the limit's JSON has the memory bandwidth, roofline_fraction
    (stepserve/bench/model_flops.py): the requests/s reached over those each bound allows."""
    # Here, not at the top: the count reads preset configs from worker_svc, which a client-only
    # install of the CLI does not import.
    from stepserve.bench.model_flops import (decode_batch_of, limit_requests_per_second, model_config,
                                            roofline_requests_per_second)
    with open(args.gemm_limit) as f:
        rates = json.load(f)
    config, rps = model_config(args.model), result["requests_per_second"]
    input_len = args.input_len + args.prefix_len
    fractions = {"gemm_fraction": rps / limit_requests_per_second(config, rates, input_len, args.output_len)}
    if "memory_gbps" in rates:
        batch = decode_batch_of(args.num_prompts, getattr(args, "max_num_seqs", None))
        fractions["roofline_fraction"] = rps / roofline_requests_per_second(config, rates, input_len,
                                                                            args.output_len, batch)
    return {key: round(value, 3) for key, value in fractions.items()}


async def run_throughput(args: argparse.Namespace) -> int:
    with service_address(args) as address:
        client = AsyncClient(address)
        try:
            await client.wait_for_workers(1, timeout_s=600)  # a local cluster's start waited for all
            info = await client.model_info()
            result = await (measure(client, info, args) if info.pooling is None else measure_embed(client, info, args))
        finally:
            await client.close()
    if args.gemm_limit:
        result.update(limit_fractions(result, args))
    result["config"] = {k: v for k, v in vars(args).items() if k not in ("func",) and not callable(v)}
    print(f"Throughput: {result['requests_per_second']:.2f} requests/s, {result['tokens_per_second']:.2f} total "
          f"tokens/s, {result['output_tokens_per_second']:.2f} output tokens/s", flush=True)
    if args.json:
        print(json.dumps(result), flush=True)
    return 0

