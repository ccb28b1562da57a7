"""Building blocks shared by the attention models, and Hugging Face weight loading.

Parameters are created with torch.empty (no init): the loader fills every one of them from a
checkpoint or from seeded random numbers, so default init would only cost start-up time.
"""
from typing import Iterable

import torch
import torch.nn.functional as F
from torch import nn


class Linear(nn.Module):
    """y = x W^T + b, the same on every rank. shard_sizes splits a fused output (q|k|v, gate|up)
    for weight loading.

    Weight loading asks a Linear for this rank's part of a full (unsharded) tensor through
    full_shape and shard; the tensor-parallel subclasses (parallel_linear.py) slice there.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool, dtype: torch.dtype,
                 shard_sizes: tuple[int, ...] = ()):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=dtype),
                                   requires_grad=False)
        self.bias = (nn.Parameter(torch.empty(out_features, dtype=dtype), requires_grad=False)
                     if bias else None)
        assert not shard_sizes or sum(shard_sizes) == out_features
        self.shard_sizes = shard_sizes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)

    @property
    def full_shard_sizes(self) -> tuple[int, ...]:
        """shard_sizes of the unsharded layer (a tensor-parallel size of 1)."""
        return self.shard_sizes

    def full_shape(self, param_name: str) -> torch.Size:
        return getattr(self, param_name).shape

    def shard(self, param_name: str, full: torch.Tensor) -> torch.Tensor:
        """full: one unfused part (q, k, gate, ...) or the whole parameter -> this rank's part."""
        return full


class Embedding(nn.Module):
    def __init__(self, num_embeddings: int, dim: int, dtype: torch.dtype):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_embeddings, dim, dtype=dtype),
                                   requires_grad=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.weight)


class RMSNorm(nn.Module):
    """Computed in float32 like Hugging Face's LlamaRMSNorm, so outputs match it closely."""

    def __init__(self, dim: int, eps: float, dtype: torch.dtype = torch.float32):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(dim, dtype=dtype), requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


class RotaryEmbedding(nn.Module):
    """Neox-style rotary embedding (rotate_half), cos/sin precomputed for every position."""

    def __init__(self, head_dim: int, max_positions: int, theta: float, dtype: torch.dtype):
        super().__init__()
        inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim)
        freqs = torch.arange(max_positions).float()[:, None] * inv_freq[None, :]  # [P, D/2]
        emb = torch.cat((freqs, freqs), dim=-1)  # [P, D]
        self.register_buffer("cos", emb.cos().to(dtype), persistent=False)
        self.register_buffer("sin", emb.sin().to(dtype), persistent=False)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        """positions: [T]; q: [T, H, D], k: [T, Hkv, D] -> rotated q, k."""
        cos = self.cos[positions].unsqueeze(1)  # [T, 1, D]
        sin = self.sin[positions].unsqueeze(1)
        return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


# Hugging Face projection name -> (our fused parameter's module name, shard index)
_FUSED = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
          "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}


def load_hf_weights(model: nn.Module, weights: Iterable[tuple[str, torch.Tensor]],
                    prefixes: tuple[str, ...], skip: tuple[str, ...] = ()) -> None:
    """Copy Hugging Face named tensors into `model`, whose names are HF's minus `prefixes`.

    q/k/v and gate/up projections land in their shard of our fused Linear; every parameter
    must be covered, so a checkpoint that misses one fails loudly instead of running garbage.
    """
    params = dict(model.named_parameters())
    modules = dict(model.named_modules())
    covered: set[str] = set()
    for name, tensor in weights:
        for prefix in prefixes:
            if name.startswith(prefix):
                name = name[len(prefix):]
                break
        if any(s in name for s in skip):
            continue
        parts = name.split(".")
        if len(parts) >= 2 and parts[-2] in _FUSED:
            fused, shard = _FUSED[parts[-2]]
            module_name = ".".join(parts[:-2] + [fused])
            target = params[f"{module_name}.{parts[-1]}"]
            module = modules[module_name]
            sizes = module.shard_sizes
            start = sum(sizes[:shard])
            target.data[start:start + sizes[shard]].copy_(module.shard(parts[-1], tensor))
            covered.add(f"{module_name}.{parts[-1]}#{shard}")
            continue
        if name not in params:
            raise ValueError(f"unexpected weight {name}")
        module = modules.get(name.rsplit(".", 1)[0])
        if isinstance(module, Linear):
            tensor = module.shard(parts[-1], tensor)
        assert params[name].shape == tensor.shape, f"{name}: {tuple(tensor.shape)} vs {tuple(params[name].shape)}"
        params[name].data.copy_(tensor)
        covered.add(name)
    missing = []
    for name in params:
        module_name = name.rsplit(".", 1)[0]
        sizes = getattr(modules.get(module_name), "shard_sizes", ())
        shards = [f"{name}#{i}" for i in range(len(sizes))] if sizes else [name]
        missing += [s for s in shards if s not in covered]
    if missing:
        raise ValueError(f"checkpoint misses weights: {missing[:8]}")
