"""The gated feed-forward block of Llama-style models: down(act(gate(x)) * up(x)).

act is SiLU (SwiGLU: Llama, Mistral, Qwen2, Jamba) or tanh-approximated GELU (GeGLU: Gemma's
gelu_pytorch_tanh), named as config.json names it.

gate and up are one fused column-parallel projection (this rank's intermediate features),
down is row-parallel (one all_reduce). Llama, Mistral and Qwen2 use it as their MLP; Jamba as
its dense feed-forward; the experts of sparse_moe.py are the same three projections, stacked.
"""
import functools

import torch
import torch.nn.functional as F
from torch import nn

from worker_svc.models.parallel_linear import ColumnParallelLinear, RowParallelLinear
from worker_svc.parallel import TensorParallel

ACTIVATIONS = {"silu": F.silu, "gelu_pytorch_tanh": functools.partial(F.gelu, approximate="tanh")}


class GatedMLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool, dtype: torch.dtype,
                 tp: TensorParallel, activation: str = "silu"):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise NotImplementedError(f"hidden activation {activation!r} (supported: {sorted(ACTIVATIONS)})")
        self.act = ACTIVATIONS[activation]
        self.gate_up_proj = ColumnParallelLinear(hidden_size, (intermediate_size, intermediate_size), bias, dtype,
                                                 tp, what="intermediate_size")
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size, bias, dtype, tp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)  # [T, inter / N] each
        return self.down_proj(self.act(gate) * up)  # [T, hidden]
