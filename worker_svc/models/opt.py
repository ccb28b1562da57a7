"""OPT (facebook/opt-*): learned positions (offset 2), LayerNorm, ReLU MLP, tied LM head.

Covers pre-LN (do_layer_norm_before, all sizes but 350m) and post-LN, and 350m's
project_in/project_out when word_embed_proj_dim differs from hidden_size.

Tensor parallel (tp.size = N): each rank holds num_attention_heads / N heads and ffn_dim / N
MLP features (both must divide by N); embeddings, positions and the LM head are replicated.
"""

import torch
import torch.nn.functional as F
from torch import nn

from worker_svc.models.base import CausalLM
from worker_svc.models.layers import Embedding, Linear
from worker_svc.models.parallel_linear import ColumnParallelLinear, RowParallelLinear
from worker_svc.models.self_attention import SelfAttention
from worker_svc.parallel import TensorParallel

_POSITION_OFFSET = 2  # OPT's learned position table starts at index 2 (fairseq heritage)


def _layer_norm(dim: int, config: dict, dtype: torch.dtype) -> nn.LayerNorm:
    norm = nn.LayerNorm(dim, elementwise_affine=config.get("layer_norm_elementwise_affine", True),
                        dtype=dtype)
    norm.requires_grad_(False)
    return norm


class OPTDecoderLayer(nn.Module):
    def __init__(self, config: dict, dtype: torch.dtype, tp: TensorParallel, layer_index: int):
        super().__init__()
        hidden_size = config["hidden_size"]
        self.pre_norm = config.get("do_layer_norm_before", True)
        if config.get("activation_function", "relu") != "relu":
            raise NotImplementedError(f"activation {config['activation_function']!r}")
        bias = config.get("enable_bias", True)
        # No grouped-query attention, no rotary: positions are added to the embedding.
        self.self_attn = SelfAttention(hidden_size, config["num_attention_heads"], config["num_attention_heads"],
                                       hidden_size // config["num_attention_heads"], dtype, tp, layer_index,
                                       qkv_bias=bias, out_bias=bias)
        self.self_attn_layer_norm = _layer_norm(hidden_size, config, dtype)
        self.fc1 = ColumnParallelLinear(hidden_size, (config["ffn_dim"],), bias, dtype, tp,
                                        what="ffn_dim")
        self.fc2 = RowParallelLinear(config["ffn_dim"], hidden_size, bias, dtype, tp)
        self.final_layer_norm = _layer_norm(hidden_size, config, dtype)

    def forward(self, h) -> torch.Tensor:
        x = self.self_attn_layer_norm(h) if self.pre_norm else h
        h = h + self.self_attn(x)
        if not self.pre_norm:
            h = self.self_attn_layer_norm(h)
        x = self.final_layer_norm(h) if self.pre_norm else h
        h = h + self.fc2(F.relu(self.fc1(x)))  # fc1: [T, ffn_dim / N]
        return h if self.pre_norm else self.final_layer_norm(h)


class OPTForCausalLM(CausalLM):
    supports_tensor_parallel = True
    supports_compile = True
    hf_prefixes = ("model.decoder.", "decoder.")

    def hf_name(self, name: str) -> str:
        return name.replace(".self_attn.out_proj.", ".self_attn.o_proj.")  # SelfAttention's name

    def __init__(self, config: dict, dtype: torch.dtype, tp: TensorParallel = TensorParallel()):
        super().__init__()
        self.config = config
        hidden_size = config["hidden_size"]
        embed_dim = config.get("word_embed_proj_dim") or hidden_size
        self.embed_tokens = Embedding(config["vocab_size"], embed_dim, dtype)
        self.embed_positions = Embedding(config["max_position_embeddings"] + _POSITION_OFFSET,
                                         hidden_size, dtype)
        self.project_in = self.project_out = None
        if embed_dim != hidden_size:
            self.project_in = Linear(embed_dim, hidden_size, False, dtype)
            self.project_out = Linear(hidden_size, embed_dim, False, dtype)
        self.layers = nn.ModuleList(OPTDecoderLayer(config, dtype, tp, i)
                                    for i in range(config["num_hidden_layers"]))
        self.final_layer_norm = None
        if config.get("do_layer_norm_before", True) and not config.get("_remove_final_layer_norm"):
            self.final_layer_norm = _layer_norm(hidden_size, config, dtype)
        self.tie_word_embeddings = config.get("tie_word_embeddings", True)
        if not self.tie_word_embeddings:
            self.lm_head = Linear(embed_dim, config["vocab_size"], False, dtype)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        h = self.embed_tokens(input_ids)  # [T, embed_dim]
        if self.project_in is not None:
            h = self.project_in(h)
        h = h + self.embed_positions(positions + _POSITION_OFFSET)  # [T, hidden]
        for layer in self.layers:
            h = layer(h)
        if self.final_layer_norm is not None:
            h = self.final_layer_norm(h)
        return self.project_out(h) if self.project_out is not None else h
