"""Building blocks shared by every model (each built in its dtype, as loaded), and Hugging Face
weight loading.

Parameters are created with torch.empty (no init): the loader fills every one of them from a
checkpoint or from seeded random numbers, so default init would only cost start-up time.
"""
from collections.abc import Callable, Iterable

import torch
import torch.nn.functional as F
from torch import nn

from worker_svc.linear_kernel import linear, pack


def parameter(*shape: int, dtype: torch.dtype) -> nn.Parameter:
    """An uninitialised, frozen parameter (the loader fills it)."""
    return nn.Parameter(torch.empty(*shape, dtype=dtype), requires_grad=False)


class Linear(nn.Module):
    """y = x W^T + b, the same on every rank. shard_sizes splits a fused output (q|k|v, gate|up)
    for weight loading.

    Weight loading asks a Linear for this rank's part of a full (unsharded) tensor through
    full_shape and shard; the tensor-parallel subclasses (parallel_linear.py) slice there.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool, dtype: torch.dtype,
                 shard_sizes: tuple[int, ...] = ()):
        super().__init__()
        self.weight = parameter(out_features, in_features, dtype=dtype)
        self.bias = parameter(out_features, dtype=dtype) if bias else None
        assert not shard_sizes or sum(shard_sizes) == out_features
        self.shard_sizes = shard_sizes
        self.register_buffer("packed_weight", None, persistent=False)  # linear_kernel.pack_weights

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias, self.packed_weight)

    def pack_weights(self) -> int:
        self.packed_weight = pack(self.weight)
        return int(self.packed_weight is not None)

    @property
    def full_shard_sizes(self) -> tuple[int, ...]:
        """shard_sizes of the unsharded layer (a tensor-parallel size of 1)."""
        return self.shard_sizes

    def full_shape(self, param_name: str) -> torch.Size:
        return getattr(self, param_name).shape

    def shard(self, param_name: str, full: torch.Tensor) -> torch.Tensor:
        """full: one unfused part (q, k, gate, ...) or the whole parameter -> this rank's part."""
        return full


def shard_full(layer: nn.Module, param_name: str, full: torch.Tensor) -> torch.Tensor:
    """full: a parameter as an unsharded layer holds it (q | k | v fused: seeded random weights,
    or a checkpoint that saves it fused, Phi-3's qkv_proj) -> this rank's q_r | k_r | v_r, each
    part sliced on its own like a checkpoint's q_proj, k_proj, v_proj. A layer without
    full_shard_sizes (stacked experts) slices its fused parts itself."""
    sizes = getattr(layer, "full_shard_sizes", ())
    parts = full.split(sizes) if sizes else (full,)
    return torch.cat([layer.shard(param_name, part) for part in parts])


class Embedding(nn.Module):
    """scale: rows are multiplied by it (Gemma: sqrt(hidden_size)), rounded to the model's dtype
    first, as transformers' scaled embedding does."""

    def __init__(self, num_embeddings: int, dim: int, dtype: torch.dtype, scale: float | None = None):
        super().__init__()
        self.weight = parameter(num_embeddings, dim, dtype=dtype)
        self.scale = None if scale is None else nn.Buffer(torch.tensor(scale).to(dtype), persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rows = F.embedding(ids, self.weight)
        return rows if self.scale is None else rows * self.scale


class RMSNorm(nn.Module):
    """Computed in float32 like Hugging Face's LlamaRMSNorm, so outputs match it closely.

    unit_offset: the checkpoint stores w - 1 and the norm multiplies by (1 + w), in float32
    before the cast back (Gemma's RMSNorm), where Llama's casts first and multiplies by w."""

    def __init__(self, dim: int, eps: float, dtype: torch.dtype, unit_offset: bool = False):
        super().__init__()
        self.weight = parameter(dim, dtype=dtype)
        self.eps = eps
        self.unit_offset = unit_offset

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.unit_offset:
            return (x32 * (1.0 + self.weight.float())).to(x.dtype)
        return self.weight * x32.to(x.dtype)


# Hugging Face projection name -> (our fused parameter's module name, shard index)
_FUSED = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
          "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}


class CheckpointMismatch(KeyError, ValueError):
    """A checkpoint that does not fit the model: a weight missing, unexpected, or of another
    shape. Both a KeyError and a ValueError: the two ways the loaders said so before there
    was one loader."""

    def __str__(self) -> str:
        return str(self.args[0])  # not KeyError's repr of the message


def load_hf_weights(model: nn.Module, weights: Iterable[tuple[str, torch.Tensor]],
                    prefixes: tuple[str, ...], skip: tuple[str, ...] = (),
                    rename: Callable[[str], str] | None = None,
                    load_special: Callable[[str, torch.Tensor], str | None] | None = None) -> None:
    """Copy Hugging Face named tensors into `model`, whose names are HF's minus `prefixes`
    (then passed through `rename` where the names differ otherwise). The one weight loader of
    every model.

    q/k/v and gate/up projections land in their shard of our fused Linear; a tensor of a layout
    of the model's own (one expert's weights, stacked in memory) goes to load_special, which returns the
    name it covered or None. A module that holds such a layout says which names cover each of
    its parameters (checkpoint_names). Every parameter must be covered, so a checkpoint that
    misses one fails loudly instead of running garbage.
    """
    params = dict(model.named_parameters())
    modules = dict(model.named_modules())
    covered: set[str] = set()
    for name, tensor in weights:
        for prefix in prefixes:
            if name.startswith(prefix):
                name = name[len(prefix):]
                break
        if rename is not None:
            name = rename(name)
        if any(s in name for s in skip):
            continue
        parts = name.split(".")
        fused_name = ".".join(parts[:-2] + [_FUSED[parts[-2]][0]]) if len(parts) >= 2 and parts[-2] in _FUSED else None
        if fused_name in modules:
            shard = _FUSED[parts[-2]][1]
            target = params[f"{fused_name}.{parts[-1]}"]
            module = modules[fused_name]
            sizes = module.shard_sizes
            start = sum(sizes[:shard])
            target.data[start:start + sizes[shard]].copy_(module.shard(parts[-1], tensor))
            covered.add(f"{fused_name}.{parts[-1]}#{shard}")
            continue
        if name not in params:
            special = load_special(name, tensor) if load_special is not None else None
            if special is None:
                raise CheckpointMismatch(f"unexpected weight {name}")
            covered.add(special)
            continue
        module = modules.get(name.rsplit(".", 1)[0])
        if hasattr(module, "shard"):  # a Linear, or stacked experts: this rank's part of a full tensor
            tensor = shard_full(module, parts[-1], tensor)
        if params[name].shape != tensor.shape:
            raise CheckpointMismatch(f"{name}: checkpoint {tuple(tensor.shape)}, model {tuple(params[name].shape)}")
        params[name].data.copy_(tensor)  # converts to the parameter's dtype
        covered.add(name)
    missing = []
    for name in params:
        if name in covered:
            continue
        module_name, _, param_name = name.rpartition(".")
        module = modules.get(module_name)
        if hasattr(module, "checkpoint_names"):
            missing += [n for n in module.checkpoint_names(module_name, param_name) if n not in covered]
            continue
        sizes = getattr(module, "shard_sizes", ())
        shards = [f"{name}#{i}" for i in range(len(sizes))] if sizes else [name]
        missing += [s for s in shards if s not in covered]
    if missing:
        raise CheckpointMismatch(f"checkpoint misses weights: {sorted(missing)[:8]}")
