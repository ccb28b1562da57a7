"""The linear layers' op on the CPU: `stepserve::linear` (csrc/small_batch_linear.cpp, one of the
step kernels: step_kernels.py), and the weights packed for it at load.

A decode step of a few sequences reads every weight to multiply it with a few rows: the op's own
kernel streams the weights as the model holds them, on the step kernels' own threads. Past a few
rows the op calls oneDNN's GEMM on a copy of the weight packed for it once at load
(pack_weights), the call inductor's frozen graph made before: so a compiled graph holds no packed
copies of its own, and every graph of the model (with the greedy head, without it, the logits)
shares one. Where the op cannot be built, and off the CPU, the layers call F.linear.
"""
import functools
import logging

import torch
import torch.nn.functional as F
from torch import nn

from worker_svc import step_kernels

log = logging.getLogger(__name__)
_loaded = False  # torch.ops.stepserve.linear is there (load)
PACKED_DTYPES = (torch.bfloat16, torch.float32)  # oneDNN's GEMM on a packed weight takes these


@functools.cache
def load() -> object | None:
    """The step kernels' module (loading it registers torch.ops.stepserve.linear), or None where it
    does not build."""
    global _loaded
    module = step_kernels.load()
    if module is not None:
        torch.library.register_fake("stepserve::linear")(_linear_shape)
        _loaded = True
    return module


def _linear_shape(x, weight, bias, packed):
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           packed: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., in] @ weight [out, in]^T + bias: the op on the CPU where it is built (packed: the
    weight as pack_weights packed it, for many rows), F.linear elsewhere."""
    if _loaded and weight.device.type == "cpu":
        return torch.ops.stepserve.linear(x, weight, bias, packed)
    return F.linear(x, weight, bias)


def pack(weight: torch.Tensor) -> torch.Tensor | None:
    """weight packed for oneDNN's GEMM, or None where the op will not use one (not the CPU, no op,
    a dtype oneDNN does not pack)."""
    if weight.device.type != "cpu" or load() is None or not packs(weight.dtype):
        return None
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach())


def packs(dtype: torch.dtype) -> bool:
    """oneDNN's GEMM takes weights of this dtype packed on this CPU: bfloat16 only with AVX512 (BW,
    VL, DQ) or AVX-NE-CONVERT; elsewhere the op's own kernel runs bfloat16 rows of any number."""
    if dtype not in PACKED_DTYPES or not torch.backends.mkldnn.is_available():
        return False
    return dtype != torch.bfloat16 or torch.ops.mkldnn._is_mkldnn_bf16_supported()


def pack_weights(model: nn.Module) -> int:
    """Packs the weight of every module that asks for it (its pack_weights method: the linear
    layers, a causal model's tied head), once the weights are loaded; how many were packed."""
    packed = sum(module.pack_weights() for module in model.modules() if hasattr(module, "pack_weights"))
    if packed:
        log.info("%d weights packed for the CPU's linear op", packed)
    return packed
