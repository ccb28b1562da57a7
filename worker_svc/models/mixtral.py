"""Llama-style decoders whose MLPs are sparse mixtures of experts (sparse_moe.py): Mixtral and
Qwen3-MoE. Attention, norms, rotary and the head are Llama's (llama.py), so are the options they
read there (Qwen3-MoE's per-head q/k norm among them); only the feed-forward differs.

- Mixtral: every layer's MLP is a mixture of num_local_experts experts of intermediate_size,
  num_experts_per_tok of them per token, their weights renormalised to sum to 1. Its checkpoints
  name the block `block_sparse_moe` and an expert's projections w1 (gate), w3 (up), w2 (down);
  renamed on load to the names transformers 5 uses in memory (`mlp`, gate/up/down_proj).
- Qwen3-MoE: layer i is sparse when i is not in mlp_only_layers and (i + 1) % decoder_sparse_step
  == 0 (and num_experts > 0), with experts of moe_intermediate_size; a dense gated MLP of
  intermediate_size otherwise. The kept weights are renormalised only when norm_topk_prob.

Tensor parallel splits each expert's intermediate features like the dense MLP's (sparse_moe.py).
"""
import re

import torch
from torch import nn

from worker_svc.models.llama import LlamaForCausalLM
from worker_svc.models.sparse_moe import SparseMoe
from worker_svc.parallel import TensorParallel

_MIXTRAL_EXPERT_PROJ = re.compile(r"\.experts\.(\d+)\.w([123])\.")
_MIXTRAL_PROJ_NAMES = {"1": "gate_proj", "2": "down_proj", "3": "up_proj"}


def _num_experts(config: dict) -> int:
    # Mixtral says num_local_experts; Qwen3-MoE num_experts (transformers 5 may save either).
    return int(config.get("num_experts") or config.get("num_local_experts") or 0)


def _sparse_moe(config: dict, intermediate_size: int, renormalize: bool, dtype: torch.dtype,
                tp: TensorParallel) -> SparseMoe:
    if config.get("hidden_act", "silu") != "silu":
        raise NotImplementedError(f"experts' hidden_act {config['hidden_act']!r} (silu only)")
    return SparseMoe(config["hidden_size"], intermediate_size, _num_experts(config), config["num_experts_per_tok"],
                     renormalize, dtype, tp)


class MixtralForCausalLM(LlamaForCausalLM):
    def feed_forward(self, config: dict, dtype: torch.dtype, tp: TensorParallel, layer_index: int) -> nn.Module:
        return _sparse_moe(config, config["intermediate_size"], True, dtype, tp)

    def hf_name(self, name: str) -> str:
        name = name.replace(".block_sparse_moe.", ".mlp.")
        return _MIXTRAL_EXPERT_PROJ.sub(lambda m: f".experts.{m[1]}.{_MIXTRAL_PROJ_NAMES[m[2]]}.", name)


class Qwen3MoeForCausalLM(LlamaForCausalLM):
    def feed_forward(self, config: dict, dtype: torch.dtype, tp: TensorParallel, layer_index: int) -> nn.Module:
        sparse = (layer_index not in (config.get("mlp_only_layers") or []) and _num_experts(config) > 0
                  and (layer_index + 1) % config.get("decoder_sparse_step", 1) == 0)
        if not sparse:
            return super().feed_forward(config, dtype, tp, layer_index)
        return _sparse_moe(config, config["moe_intermediate_size"], bool(config.get("norm_topk_prob", False)),
                           dtype, tp)
