"""Tensor-parallel linear layers (Megatron style): column-parallel, then row-parallel.

A column-parallel layer splits its output features: rank r computes its slice of y with no
communication. The row-parallel layer after it splits its input features to match, so each rank
holds a partial sum of y; one all_reduce makes the full y on every rank. Attention heads (q/k/v
-> o_proj) and MLP features (gate/up -> down_proj, fc1 -> fc2) split this way, one all_reduce
per block. At a tensor-parallel size of 1 both are plain Linears.
"""
import torch

from worker_svc.linear_kernel import linear
from worker_svc.models.layers import Linear
from worker_svc.parallel import TensorParallel


class ColumnParallelLinear(Linear):
    """Rank r holds rows [r * n / N, (r + 1) * n / N) of each fused part (q, k, v or gate, up),
    so its output is q_r | k_r | v_r: its own heads, laid out like an unsharded layer's."""

    def __init__(self, in_features: int, part_sizes: tuple[int, ...], bias: bool,
                 dtype: torch.dtype, tp: TensorParallel, what: str = "output features"):
        local = tuple(tp.divide(n, what) for n in part_sizes)
        super().__init__(in_features, sum(local), bias, dtype,
                         shard_sizes=local if len(local) > 1 else ())
        self.tp = tp
        self._full_part_sizes = tuple(part_sizes)

    @property
    def full_shard_sizes(self) -> tuple[int, ...]:
        return self._full_part_sizes if len(self._full_part_sizes) > 1 else ()

    def full_shape(self, param_name: str) -> torch.Size:
        shape = list(getattr(self, param_name).shape)
        shape[0] = sum(self._full_part_sizes)
        return torch.Size(shape)

    def shard(self, param_name: str, full: torch.Tensor) -> torch.Tensor:
        return full.chunk(self.tp.size, dim=0)[self.tp.rank]  # weight [n, in] or bias [n]


class RowParallelLinear(Linear):
    """Rank r holds columns [r * n / N, (r + 1) * n / N) of W; y = all_reduce(x_r W_r^T) + b.

    The bias is added once, after the sum, so it is not counted N times."""

    def __init__(self, in_features: int, out_features: int, bias: bool, dtype: torch.dtype,
                 tp: TensorParallel, what: str = "input features"):
        super().__init__(tp.divide(in_features, what), out_features, bias, dtype)
        self.tp = tp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return linear(x, self.weight, self.bias, self.packed_weight)  # x: [T, in] -> [T, out]
        y = self.tp.all_reduce(linear(x, self.weight, None, self.packed_weight))  # x: [T, in / N] -> partial y [T, out]
        return y if self.bias is None else y + self.bias

    def full_shape(self, param_name: str) -> torch.Size:
        shape = getattr(self, param_name).shape
        if param_name == "bias":
            return shape
        return torch.Size((shape[0], shape[1] * self.tp.size))

    def shard(self, param_name: str, full: torch.Tensor) -> torch.Tensor:
        if param_name == "bias":
            return full  # replicated, added once after the all_reduce
        return full.chunk(self.tp.size, dim=1)[self.tp.rank]  # [out, in] -> [out, in / N]
