"""Jamba: a hybrid of attention and Mamba layers, the `JambaForCausalLM` of a config.json.

Layer i is attention when i % attn_layer_period == attn_layer_offset, Mamba otherwise; its
feed-forward is a top-k MoE when i % expert_layer_period == expert_layer_offset and
num_experts > 1, a plain gated MLP otherwise. Each layer: x + mixer(norm(x)), then
x + ffn(norm(x)). Jamba's attention has no positional encoding (no RoPE): the Mamba layers
carry order.

Caches: the i-th attention layer uses caches.kv[i] (paged KV), the j-th Mamba layer
caches.conv[j] / caches.ssm[j] (rows by state slot); the runner needs both kinds.
"""
import math

import torch
from torch import nn

from worker_svc.forward_context import get_forward_context
from worker_svc.kv_cache import CacheSpec
from worker_svc.models.base import CausalLM
from worker_svc.models.gated_mlp import GatedMLP
from worker_svc.models.layers import Embedding, Linear, RMSNorm
from worker_svc.models.mamba_mixer import STATE_DTYPE, MambaMixer
from worker_svc.models.self_attention import SelfAttention
from worker_svc.models.sparse_moe import SparseMoe
from worker_svc.parallel import TensorParallel


def _mamba_mixer(cfg: dict, dtype: torch.dtype) -> MambaMixer:
    hidden = cfg["hidden_size"]
    dt_rank = cfg.get("mamba_dt_rank", "auto")
    dt_rank = math.ceil(hidden / 16) if dt_rank == "auto" else int(dt_rank)
    return MambaMixer(
        hidden, cfg.get("mamba_expand", 2) * hidden, cfg.get("mamba_d_state", 16),
        cfg.get("mamba_d_conv", 4), dt_rank, conv_bias=cfg.get("mamba_conv_bias", True),
        proj_bias=cfg.get("mamba_proj_bias", False), dtype=dtype, bcdt_norm_eps=cfg.get("rms_norm_eps", 1e-6))


class JambaDecoderLayer(nn.Module):
    def __init__(self, cfg: dict, dtype: torch.dtype, is_attention: bool, num_experts: int, cache_index: int):
        """cache_index: its KV (caches.kv[cache_index]) or its Mamba state (caches.conv / ssm)."""
        super().__init__()
        hidden, eps = cfg["hidden_size"], cfg.get("rms_norm_eps", 1e-6)
        self.is_attention = is_attention
        self.cache_index = cache_index
        # Hugging Face names: `self_attn` on attention layers, `mamba` on the others.
        if is_attention:  # no positional encoding: the Mamba layers carry order
            num_heads = cfg["num_attention_heads"]
            self.self_attn = SelfAttention(hidden, num_heads, cfg.get("num_key_value_heads") or num_heads,
                                           cfg.get("head_dim") or hidden // num_heads, dtype, TensorParallel(),
                                           cache_index)
        else:
            self.mamba = _mamba_mixer(cfg, dtype)
        # Jamba's experts' kept weights are not renormalised (transformers' JambaSparseMoeBlock).
        self.feed_forward = (
            SparseMoe(hidden, cfg["intermediate_size"], num_experts, cfg.get("num_experts_per_tok", 2),
                      renormalize=False, dtype=dtype, tp=TensorParallel())
            if num_experts > 1 else GatedMLP(hidden, cfg["intermediate_size"], False, dtype, TensorParallel()))
        self.input_layernorm = RMSNorm(hidden, eps, dtype)
        self.pre_ff_layernorm = RMSNorm(hidden, eps, dtype)

    def forward(self, h, context) -> torch.Tensor:
        x = self.input_layernorm(h)
        if self.is_attention:
            h = h + self.self_attn(x)
        else:
            h = h + self.mamba(x, context.state_layout, context.caches.conv[self.cache_index],
                               context.caches.ssm[self.cache_index])
        return h + self.feed_forward(self.pre_ff_layernorm(h))


class JambaForCausalLM(CausalLM):
    def __init__(self, config: dict, dtype: torch.dtype, tp: TensorParallel = TensorParallel()):
        """tp: always one rank (supports_tensor_parallel is False; the loader says so)."""
        super().__init__()
        if config.get("hidden_act", "silu") != "silu":
            raise ValueError(f"Jamba hidden_act {config['hidden_act']!r} unsupported (silu only)")
        self.config, self.dtype = config, dtype
        hidden, vocab = config["hidden_size"], config["vocab_size"]
        attn_period, attn_offset = config.get("attn_layer_period", 8), config.get("attn_layer_offset", 4)
        exp_period, exp_offset = config.get("expert_layer_period", 2), config.get("expert_layer_offset", 1)
        num_experts = config.get("num_experts", config.get("num_local_experts", 16))
        counts = {True: 0, False: 0}
        self.layers = nn.ModuleList()
        for i in range(config["num_hidden_layers"]):
            is_attention = i % attn_period == attn_offset
            self.layers.append(JambaDecoderLayer(config, dtype, is_attention,
                                                 num_experts if i % exp_period == exp_offset else 1,
                                                 cache_index=counts[is_attention]))
            counts[is_attention] += 1
        self.num_attention_layers, self.num_mamba_layers = counts[True], counts[False]
        self.embed_tokens = Embedding(vocab, hidden, dtype)
        self.final_layernorm = RMSNorm(hidden, config.get("rms_norm_eps", 1e-6), dtype)
        self.tie_word_embeddings = config.get("tie_word_embeddings", False)
        if not self.tie_word_embeddings:
            self.lm_head = Linear(hidden, vocab, False, dtype)

    @property
    def cache_index(self) -> list[int]:
        """Each layer's index into caches.kv (attention) or caches.conv / caches.ssm (Mamba)."""
        return [layer.cache_index for layer in self.layers]

    def cache_spec(self) -> CacheSpec:
        attn = next((layer.self_attn for layer in self.layers if layer.is_attention), None)
        mixer = next((layer.mamba for layer in self.layers if not layer.is_attention), None)
        return CacheSpec(
            num_attention_layers=self.num_attention_layers,
            num_kv_heads=attn.num_kv_heads if attn else 0,
            head_dim=attn.head_dim if attn else 0,
            num_state_layers=self.num_mamba_layers,
            conv_state_shape=(mixer.d_inner, mixer.d_conv) if mixer else (),
            ssm_state_shape=(mixer.d_inner, mixer.d_state) if mixer else (),
            state_dtype=STATE_DTYPE,
        )

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Packed tokens -> hidden [T, hidden]; writes KV and updates the slots' state rows
        (positions are unused: Jamba has no positional encoding)."""
        context = get_forward_context()
        h = self.embed_tokens(input_ids)  # [T, hidden]
        for layer in self.layers:
            h = layer(h, context)
        return self.final_layernorm(h)

    def hf_name(self, name: str) -> str:
        return name.replace(".feed_forward.router.", ".feed_forward.gate.")  # SparseMoe's name
