"""Llama, and the configs that differ from it only by options: Llama 3.x, Mistral, Qwen2, Qwen3
and Phi-3 (its fused qkv_proj / gate_up_proj are our own layout: loaded as they are).

Options read from config.json: num_key_value_heads (GQA), head_dim, the rotary embedding
(rotary.py: every rope type, partial rotary), rms_norm_eps, attention_bias (all four projections, Llama and Qwen3) or
Qwen2's q/k/v bias, Qwen3's per-head q/k RMSNorm (model_type qwen3 / qwen3_moe), mlp_bias,
tie_word_embeddings, and the sliding window (Mistral's sliding_window, Qwen2's
use_sliding_window: layer_types.py).

Tensor parallel (tp.size = N): each rank holds num_attention_heads / N query heads and
num_key_value_heads / N KV heads (so both must divide by N; a GQA model with fewer KV heads than
ranks is refused rather than replicating KV heads), and intermediate_size / N MLP features.
Embeddings and the LM head are replicated.
"""

import torch
from torch import nn

from worker_svc.models.base import CausalLM
from worker_svc.models.gated_mlp import GatedMLP
from worker_svc.models.layer_types import sliding_windows
from worker_svc.models.layers import Embedding, Linear, RMSNorm
from worker_svc.models.rotary import rotary_from_config
from worker_svc.models.self_attention import SelfAttention
from worker_svc.parallel import TensorParallel


_QK_NORM_MODEL_TYPES = ("qwen3", "qwen3_moe")  # per-head RMSNorm of q and k before rotary


def attention_from_config(config: dict, dtype: torch.dtype, tp: TensorParallel, layer_index: int) -> SelfAttention:
    """The self-attention of a Llama-style layer as config.json describes it (also Qwen3-MoE's)."""
    hidden_size, num_heads = config["hidden_size"], config["num_attention_heads"]
    attention_bias = bool(config.get("attention_bias", False))  # all four projections (Llama, Qwen3)
    qk_norm = config.get("model_type") in _QK_NORM_MODEL_TYPES
    return SelfAttention(hidden_size, num_heads, config.get("num_key_value_heads") or num_heads,
                         config.get("head_dim") or hidden_size // num_heads, dtype, tp, layer_index,
                         qkv_bias=attention_bias or config.get("model_type") == "qwen2", out_bias=attention_bias,
                         qk_norm_eps=config.get("rms_norm_eps", 1e-6) if qk_norm else None,
                         sliding_window=sliding_windows(config)[layer_index])


def _mlp(config: dict, dtype: torch.dtype, tp: TensorParallel) -> GatedMLP:
    if config.get("hidden_act", "silu") != "silu":
        raise NotImplementedError(f"hidden_act {config['hidden_act']!r}")
    return GatedMLP(config["hidden_size"], config["intermediate_size"], bool(config.get("mlp_bias", False)),
                    dtype, tp)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: dict, dtype: torch.dtype, tp: TensorParallel, layer_index: int,
                 mlp: nn.Module):
        super().__init__()
        eps = config.get("rms_norm_eps", 1e-6)
        self.input_layernorm = RMSNorm(config["hidden_size"], eps, dtype)
        self.self_attn = attention_from_config(config, dtype, tp, layer_index)
        self.post_attention_layernorm = RMSNorm(config["hidden_size"], eps, dtype)
        self.mlp = mlp

    def forward(self, h, rotary, positions) -> torch.Tensor:
        h = h + self.self_attn(self.input_layernorm(h), rotary, positions)
        return h + self.mlp(self.post_attention_layernorm(h))


class LlamaForCausalLM(CausalLM):
    supports_tensor_parallel = True
    supports_compile = True
    hf_skip = ("rotary_emb.inv_freq",)

    def __init__(self, config: dict, dtype: torch.dtype, tp: TensorParallel = TensorParallel()):
        super().__init__()
        self.config = config
        hidden_size = config["hidden_size"]
        self.embed_tokens = Embedding(config["vocab_size"], hidden_size, dtype)
        self.layers = nn.ModuleList(LlamaDecoderLayer(config, dtype, tp, i, self.feed_forward(config, dtype, tp, i))
                                    for i in range(config["num_hidden_layers"]))
        self.norm = RMSNorm(hidden_size, config.get("rms_norm_eps", 1e-6), dtype)
        self.tie_word_embeddings = bool(config.get("tie_word_embeddings", False))
        if not self.tie_word_embeddings:
            self.lm_head = Linear(hidden_size, config["vocab_size"], False, dtype)
        attn = self.layers[0].self_attn
        # Phi-3's generate recomputes a sequence when it passes longrope's switch (rotary.py)
        anchor = "sequence" if config.get("model_type") == "phi3" else "prompt"
        self.rotary = rotary_from_config(config, attn.head_dim, dtype, length_anchor=anchor)

    def feed_forward(self, config: dict, dtype: torch.dtype, tp: TensorParallel, layer_index: int) -> nn.Module:
        """Layer layer_index's MLP: the gated MLP here; mixtures of experts in subclasses (mixtral.py)."""
        return _mlp(config, dtype, tp)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        h = self.embed_tokens(input_ids)  # [T, hidden]
        for layer in self.layers:
            h = layer(h, self.rotary, positions)
        return self.norm(h)


class LlamaModel(LlamaForCausalLM):
    """A Llama-style model saved without its head (Qwen3Model, LlamaModel: how
    sentence-transformers saves Qwen3-Embedding): an embedder only. Its head is tied to the
    input embedding, so that it holds no weight of its own; pooling never calls it."""

    def __init__(self, config: dict, dtype: torch.dtype, tp: TensorParallel = TensorParallel()):
        super().__init__({**config, "tie_word_embeddings": True}, dtype, tp)
