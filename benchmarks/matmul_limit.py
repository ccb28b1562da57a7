"""The machine's GEMM rate at a model's own shapes, the limit a throughput figure is held against:

    python -m benchmarks.matmul_limit --model qwen3-0.6b --dtype bfloat16 --out /tmp/limit.json
    stepserve bench throughput --model qwen3-0.6b --gemm-limit /tmp/limit.json --json

It runs a step's linear layers as the model holds them (every decoder layer's own weights, so
they stream from memory as in a real step rather than sitting in cache) on all cores: at
--decode-batch rows (a decode step), at --prefill-tokens rows (a prefill step), and the head at
--decode-batch rows (one per sequence). Each runs two ways, torch's F.linear and, on a CPU,
oneDNN's linear on weights reordered once for it (`mkldnn._linear_pointwise`, what inductor's
frozen graph and vLLM's `onednn_mm` call), and the faster counts: on a 2-vCPU AMD EPYC with
avx512_bf16, Qwen3-0.6B's decode GEMMs ran at 0.35-0.37 TFLOP/s with F.linear at 32 rows and
0.44-0.45 prepacked, so F.linear alone understated the limit. Each rate is the best of --repeats
timed passes after two untimed ones, in TFLOP/s: a limit is what the machine can do, and a
shared host's noise only ever slows a pass (the median of 5 gave 0.21-0.40 TFLOP/s for
Qwen3-0.6B's decode GEMMs within one afternoon). The JSON also gives, for --input-len / --output-len,
the requests/s that these rates allow (stepserve/bench/model_flops.py's count), and the CPU.

It also measures the memory bandwidth (`memory_gbps`: the best pass of a sum over --memory-mib of
float32, far past the caches, on all cores), for the roofline that holds decode steps to their
reads as well (`roofline_requests_per_second`, `bench throughput`'s `roofline_fraction`): a
decode step over long contexts reads more bytes (weights, every sequence's KV) than its
arithmetic can hide.

`bench throughput --gemm-limit FILE` divides its requests/s by the same count at its own
lengths: `gemm_fraction`. Prompt tokens are held to the prefill rate, generated ones to the
decode rate, sampled rows to the head's.
"""
import argparse
import functools
import json
import sys
import time

import torch
import torch.nn.functional as F

from benchmarks.cpu_info import cpu_summary
from stepserve.bench.model_flops import (Gemm, decode_batch_of, head_gemm, layer_gemms, limit_requests_per_second,
                                        model_config, roofline_requests_per_second)

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def _prepacked_linear(weight: torch.Tensor, tokens: int):
    """oneDNN's linear on weight reordered once for `tokens` rows, or None where torch has no oneDNN."""
    if not torch.backends.mkldnn.is_available():
        return None
    try:
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, tokens)
        linear = lambda x: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [None], "")  # noqa: E731
        linear(torch.zeros(1, weight.shape[1], dtype=weight.dtype))  # raises here for a dtype it does not take
        return linear
    except (RuntimeError, AttributeError):  # a dtype or build it does not take
        return None


def time_gemms(gemms: list[Gemm], tokens: int, dtype: torch.dtype, repeats: int) -> float:
    """TFLOP/s of one pass through `gemms` (each `count` times, each with its own weight) at `tokens` rows:
    the faster of F.linear and the prepacked oneDNN linear."""
    generator = torch.Generator().manual_seed(0)
    weights = [[torch.randn(g.out_features, g.in_features, generator=generator).to(dtype) for _ in range(g.count)]
               for g in gemms]
    inputs = {g.in_features: torch.randn(tokens, g.in_features, generator=generator).to(dtype) for g in gemms}
    plain = [[functools.partial(F.linear, weight=w) for w in ws] for ws in weights]
    prepacked = [[_prepacked_linear(w, tokens) for w in ws] for ws in weights]
    ways = [plain] + ([prepacked] if all(f is not None for fs in prepacked for f in fs) else [])
    return max(_best_pass_tflops(gemms, linears, inputs, tokens, repeats) for linears in ways)


def _best_pass_tflops(gemms: list[Gemm], linears: list[list], inputs: dict, tokens: int, repeats: int) -> float:
    """TFLOP/s of the best timed pass, each GEMM's layers run by linears[gemm][layer]."""

    def one_pass() -> float:
        start = time.perf_counter()
        for layer in range(max(g.count for g in gemms)):
            for g, fs in zip(gemms, linears):
                if layer < g.count:
                    fs[layer](inputs[g.in_features])
        return time.perf_counter() - start

    with torch.inference_mode():
        for _ in range(2):
            one_pass()
        seconds = min(one_pass() for _ in range(repeats))
    return sum(g.flops(tokens) for g in gemms) / seconds / 1e12


def memory_gbps(mebibytes: int, repeats: int) -> float:
    """GB/s of the best pass of a sum over `mebibytes` of float32 (a read-only stream, all cores)."""
    data = torch.ones(mebibytes << 18, dtype=torch.float32)
    for _ in range(2):
        data.sum()
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        data.sum()
        seconds.append(time.perf_counter() - start)
    return data.numel() * data.element_size() / min(seconds) / 1e9


def measure(model: str, dtype_name: str, decode_batch: int, prefill_tokens: int, repeats: int,
            memory_mib: int = 1024) -> dict:
    config = model_config(model)
    dtype = DTYPES[dtype_name]
    layers = layer_gemms(config)
    per_gemm = {g.name: round(time_gemms([g], decode_batch, dtype, repeats), 3) for g in layers}
    return {
        "model": model, "dtype": dtype_name, "threads": torch.get_num_threads(), "cpu": cpu_summary(),
        "decode_batch": decode_batch, "prefill_tokens": prefill_tokens,
        "decode_tflops": round(time_gemms(layers, decode_batch, dtype, repeats), 3),
        "prefill_tflops": round(time_gemms(layers, prefill_tokens, dtype, repeats), 3),
        "head_tflops": round(time_gemms([head_gemm(config)], decode_batch, dtype, repeats), 3),
        "decode_tflops_by_gemm": per_gemm,
        "memory_gbps": round(memory_gbps(memory_mib, repeats), 2),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.matmul_limit", description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="preset name or Hugging Face folder")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    p.add_argument("--decode-batch", type=int, default=256)
    p.add_argument("--prefill-tokens", type=int, default=2048)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--memory-mib", type=int, default=1024, help="the buffer the memory bandwidth is read from")
    p.add_argument("--input-len", type=int, default=16, help="for the requests/s limits")
    p.add_argument("--output-len", type=int, default=16, help="for the requests/s limits")
    p.add_argument("--num-prompts", type=int, default=256,
                   help="for the roofline: this many sequences decode together (at most the scheduler's max_num_seqs)")
    p.add_argument("--out", default=None, help="write the JSON here too")
    args = p.parse_args(argv)
    result = measure(args.model, args.dtype, args.decode_batch, args.prefill_tokens, args.repeats, args.memory_mib)
    result["input_len"], result["output_len"] = args.input_len, args.output_len
    config = model_config(args.model)
    result["limit_requests_per_second"] = round(
        limit_requests_per_second(config, result, args.input_len, args.output_len), 2)
    result["roofline_requests_per_second"] = round(roofline_requests_per_second(
        config, result, args.input_len, args.output_len, decode_batch_of(args.num_prompts)), 3)
    text = json.dumps(result)
    print(text, flush=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
