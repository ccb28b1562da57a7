"""Self-attention on the paged KV cache, as every attention model here has it.

A fused q|k|v projection (column-parallel: this rank's query heads and their KV heads), the
attention op over the forward context's KV of this layer, and an output projection (row-parallel:
one all_reduce). Models differ only by options: grouped-query heads, biases, head_dim, and
whether rotary positions turn q and k (Llama: yes; OPT adds learned positions to the embedding;
Jamba has none), a per-head RMSNorm of q and k before rotary (q_norm / k_norm over head_dim:
Qwen3; Gemma 3's with (1 + w)), and the attention op's per-layer options: the query scale
(Gemma's query_pre_attn_scalar ** -0.5), a sliding window (Mistral, Gemma's local layers) and
logit soft-capping (Gemma 2). Hugging Face calls the output projection o_proj (Llama, Jamba) or
out_proj (OPT, renamed on load).
"""
import torch
from torch import nn

from worker_svc.attention import attention
from worker_svc.models.layers import RMSNorm
from worker_svc.models.parallel_linear import ColumnParallelLinear, RowParallelLinear
from worker_svc.models.rotary import RotaryEmbedding
from worker_svc.parallel import TensorParallel


class SelfAttention(nn.Module):
    def __init__(self, hidden_size: int, num_heads: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype,
                 tp: TensorParallel, layer_index: int, qkv_bias: bool = False, out_bias: bool = False,
                 qk_norm_eps: float | None = None, qk_norm_unit_offset: bool = False, scale: float | None = None,
                 sliding_window: int | None = None, softcap: float | None = None):
        """layer_index: which of the model's attention layers this is (its KV: caches.kv[layer_index]);
        qk_norm_eps: set, each head's q and k are RMS-normalised over head_dim (Qwen3, Gemma 3),
        by (1 + w) with qk_norm_unit_offset (Gemma 3); scale: of the scores (default
        head_dim ** -0.5); sliding_window, softcap: the attention op's options (attention.py)."""
        super().__init__()
        self.layer_index = layer_index
        self.head_dim = head_dim
        # This rank's heads: query heads r*H/N.. use KV heads r*Hkv/N.., the same grouping. A
        # model with fewer KV heads than ranks is refused rather than replicating KV heads.
        self.num_heads = tp.divide(num_heads, "num_attention_heads")
        self.num_kv_heads = tp.divide(num_kv_heads, "num_key_value_heads")
        q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
        self.qkv_proj = ColumnParallelLinear(hidden_size, (q_size, kv_size, kv_size), qkv_bias, dtype, tp,
                                             what="attention heads")
        self.o_proj = RowParallelLinear(q_size, hidden_size, out_bias, dtype, tp)
        self.scale = head_dim ** -0.5 if scale is None else scale
        self.sliding_window, self.softcap = sliding_window, softcap
        self.q_norm = self.k_norm = None
        if qk_norm_eps is not None:  # one weight of head_dim shared by every head: the same on each rank
            self.q_norm = RMSNorm(head_dim, qk_norm_eps, dtype, qk_norm_unit_offset)
            self.k_norm = RMSNorm(head_dim, qk_norm_eps, dtype, qk_norm_unit_offset)

    def forward(self, x: torch.Tensor, rotary: RotaryEmbedding | None = None,
                positions: torch.Tensor | None = None) -> torch.Tensor:
        num_tokens = x.shape[0]
        q, k, v = self.qkv_proj(x).split(self.qkv_proj.shard_sizes, dim=-1)
        q = q.view(num_tokens, self.num_heads, self.head_dim)  # q: [T, H / N, D]
        k = k.view(num_tokens, self.num_kv_heads, self.head_dim)  # k: [T, Hkv / N, D]
        v = v.view(num_tokens, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if rotary is not None:
            q, k = rotary(positions, q, k)
        out = attention(q, k, v, self.layer_index, self.scale, self.sliding_window, self.softcap)
        return self.o_proj(out)  # [T, hidden]
