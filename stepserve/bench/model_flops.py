"""The matrix work of a decoder model, counted from its config: the GEMM shapes of one step and
the floating-point operations of one request. The measure a throughput is held against
(benchmarks/matmul_limit.py times these shapes on the machine; `bench throughput --gemm-limit`
turns requests/s into the fraction of that rate it reached).

Counted: every linear layer of every decoder layer (attention's q, k, v, o; the MLP's, each
token's routed experts for a mixture) for every token, and the head for each sampled token (the
last prompt token and every generated one but the last: exactly the rows a step's head runs).
Not counted: attention's scores and values (they grow with the context, not the weights; at 16
in / 16 out they are under 1% of the whole), norms, rotary, the embedding lookup.

The GEMM limit holds every step to its multiplications alone. A decode step over long contexts
is bound by memory instead: it reads every weight once and every sequence's keys and values
(Qwen3-0.6B at 32 x 512 in / 128 out reads ~1.2 GB of weights and ~2.1 GB of KV a step, for
~28 GFLOP). `roofline_requests_per_second` holds each phase of a decode step (the linear layers,
then attention) to the slower of its arithmetic and its reads at the measured memory bandwidth,
and prefills to their arithmetic: the bound a throughput is held against in `roofline_fraction`.
"""
import json
import os
from dataclasses import dataclass

from scheduler_svc.config import SchedulerConfig
from worker_svc import presets


@dataclass(frozen=True)
class Gemm:
    """One linear layer: [tokens, in_features] x [in_features, out_features], `count` of them per step."""

    name: str
    in_features: int
    out_features: int
    count: int

    def flops(self, tokens: int) -> int:
        return 2 * tokens * self.in_features * self.out_features * self.count


def model_config(model: str) -> dict:
    """A preset's config, or a Hugging Face folder's config.json (its text_config for a wrapper)."""
    if presets.is_preset(model):
        return presets.preset_config(model)
    with open(os.path.join(model, "config.json")) as f:
        config = json.load(f)
    return config.get("text_config", config)


def _attention_shape(config: dict) -> tuple[int, int, int, int]:
    """(layers, query heads, KV heads, head_dim)."""
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    return config["num_hidden_layers"], heads, config.get("num_key_value_heads", heads), head_dim


def layer_gemms(config: dict) -> list[Gemm]:
    """The linear layers every token goes through, over all decoder layers (the head apart)."""
    hidden = config["hidden_size"]
    layers, heads, kv_heads, head_dim = _attention_shape(config)
    mlp = config.get("intermediate_size") or config.get("ffn_dim") or 4 * hidden
    gemms = [Gemm("qkv", hidden, (heads + 2 * kv_heads) * head_dim, layers),
             Gemm("o", heads * head_dim, hidden, layers)]
    if config.get("model_type") == "opt":  # fc1, fc2: no gate
        return gemms + [Gemm("fc1", hidden, mlp, layers), Gemm("fc2", mlp, hidden, layers)]
    experts_per_token = config.get("num_experts_per_tok", 1)
    return gemms + [Gemm("gate_up", hidden, 2 * mlp, layers * experts_per_token),
                    Gemm("down", mlp, hidden, layers * experts_per_token)]


def head_gemm(config: dict) -> Gemm:
    return Gemm("head", config.get("word_embed_proj_dim") or config["hidden_size"], config["vocab_size"], 1)


def request_flops(config: dict, input_len: int, output_len: int) -> int:
    """One request of input_len prompt tokens and output_len generated ones: its tokens through
    every layer (the last generated token is never fed back), the head once per generated token."""
    tokens = input_len + output_len - 1
    return sum(g.flops(tokens) for g in layer_gemms(config)) + head_gemm(config).flops(output_len)


def limit_requests_per_second(config: dict, rates: dict, input_len: int, output_len: int) -> float:
    """The requests/s that a machine's measured GEMM rates allow (benchmarks/matmul_limit.py's
    JSON: prefill_tflops, decode_tflops, head_tflops): prompt tokens at the prefill rate,
    generated tokens fed back at the decode rate, the head's rows at the head's rate."""
    layers = layer_gemms(config)
    seconds = (sum(g.flops(input_len) for g in layers) / (rates["prefill_tflops"] * 1e12)
               + sum(g.flops(output_len - 1) for g in layers) / (rates["decode_tflops"] * 1e12)
               + head_gemm(config).flops(output_len) / (rates["head_tflops"] * 1e12))
    return 1 / seconds


DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


def kv_bytes_per_token(config: dict, dtype_bytes: int) -> int:
    """One token's keys and values over all layers, as the cache holds them."""
    layers, _, kv_heads, head_dim = _attention_shape(config)
    return 2 * layers * kv_heads * head_dim * dtype_bytes


def attention_flops(config: dict, num_keys: int) -> int:
    """One query token over num_keys keys in every layer: its scores and its weighted values."""
    layers, heads, _, head_dim = _attention_shape(config)
    return 4 * layers * heads * head_dim * num_keys


def weight_bytes(config: dict, dtype_bytes: int) -> int:
    """The weights a decode step reads: every counted linear layer and the head."""
    gemms = [*layer_gemms(config), head_gemm(config)]
    return sum(g.in_features * g.out_features * g.count for g in gemms) * dtype_bytes


def decode_batch_of(num_prompts: int, max_num_seqs: int | None = None) -> int:
    """The sequences that decode together when num_prompts are handed over at once: all of them, up
    to the scheduler's max_num_seqs (its default unless given; vLLM's is the same 256). That is one
    replica's batch: where several replicas split the prompts (a small model, one per core), each
    reads its weights for fewer sequences, and the roofline is looser than it could be."""
    return min(num_prompts, max_num_seqs or SchedulerConfig.max_num_seqs)


def roofline_requests_per_second(config: dict, rates: dict, input_len: int, output_len: int,
                                 decode_batch: int) -> float:
    """The requests/s that the machine's GEMM rates and memory bandwidth allow (matmul_limit's
    JSON: the three rates, memory_gbps and dtype), with decode_batch sequences decoding together.
    A prompt costs its GEMMs and its causal attention at the prefill rate (its weights are read
    once for thousands of tokens). Each of the output_len - 1 decode steps runs two phases one
    after the other, each held to the slower of its arithmetic and its reads at memory_gbps: the
    linear layers and the head (their rates; the weights read once for the batch), then
    attention (over each sequence's context at the decode rate; its whole KV read)."""
    dtype_bytes = DTYPE_BYTES[rates["dtype"]]
    layers, head = layer_gemms(config), head_gemm(config)
    prefill, decode, head_rate = (rates[k] * 1e12 for k in ("prefill_tflops", "decode_tflops", "head_tflops"))
    causal_keys = input_len * (input_len + 1) // 2
    seconds = (sum(g.flops(input_len) for g in layers) + attention_flops(config, causal_keys)) / prefill
    seconds += head.flops(1) / head_rate
    bandwidth = rates["memory_gbps"] * 1e9
    kv_per_token = kv_bytes_per_token(config, dtype_bytes)
    linear_phase = max(sum(g.flops(1) for g in layers) / decode + head.flops(1) / head_rate,
                       weight_bytes(config, dtype_bytes) / decode_batch / bandwidth)
    for context in range(input_len + 1, input_len + output_len):
        seconds += linear_phase + max(attention_flops(config, context) / decode, context * kv_per_token / bandwidth)
    return 1 / seconds
