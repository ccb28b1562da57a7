"""The matrix work of a decoder model, counted from its config: the GEMM shapes of one step and
the floating-point operations of one request. The measure a throughput is held against
(benchmarks/matmul_limit.py times these shapes on the machine; `bench throughput --gemm-limit`
turns requests/s into the fraction of that rate it reached).

Counted: every linear layer of every decoder layer (attention's q, k, v, o; the MLP's, each
token's routed experts for a mixture) for every token, and the head for each sampled token (the
last prompt token and every generated one but the last: exactly the rows a step's head runs).
Not counted: attention's scores and values (they grow with the context, not the weights; at 16
in / 16 out they are under 1% of the whole), norms, rotary, the embedding lookup.
"""
import json
import os
from dataclasses import dataclass

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


def layer_gemms(config: dict) -> list[Gemm]:
    """The linear layers every token goes through, over all decoder layers (the head apart)."""
    hidden, layers = config["hidden_size"], config["num_hidden_layers"]
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads", heads)
    head_dim = config.get("head_dim") or hidden // heads
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
