"""The CPU linear op (worker_svc/csrc/small_batch_linear.cpp, `stepserve::linear`) against F.linear
in float64: its own kernel up to 8 rows (float32 and bfloat16 on the vector path, float16 on the
plain loop; K in whole vector steps and with a tail; fewer weight rows than a tile; x rows of any
stride; a bias or none; one thread and several), and past 8 rows oneDNN's GEMM on the packed
weight, or at::linear without one (bfloat16 where oneDNN has no bfloat16 GEMM: the kernel, 8 rows
at a time). Each output is the exact sum rounded once to the dtype, within
the rounding of a float32 sum of K products."""
import pytest
import torch
import torch.nn.functional as F

from tests.native_kernels import built
from worker_svc import linear_kernel

TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 8e-3, torch.float16: 1e-3}  # of the largest |y|


def _check(y: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    exact = F.linear(x.double(), weight.double(), None if bias is None else bias.double())
    assert y.dtype == x.dtype and y.shape == exact.shape
    scale = exact.abs().max().item()
    assert (y.double() - exact).abs().max().item() <= TOLERANCE[x.dtype] * scale


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 8, 9, 20])
@pytest.mark.parametrize("in_features,out_features", [(1024, 37), (40, 1000), (7, 3)])
def test_linear_equals_the_exact_product(dtype, rows, in_features, out_features):
    built(linear_kernel.load, "linear kernel")
    generator = torch.Generator().manual_seed(rows * in_features + out_features)
    weight = torch.randn(out_features, in_features, generator=generator).to(dtype)
    bias = torch.randn(out_features, generator=generator).to(dtype) if rows % 2 else None
    wide = torch.randn(rows, in_features + 5, generator=generator).to(dtype)
    x = wide[:, 2:2 + in_features]  # rows of a wider tensor: a stride of its own
    packed = linear_kernel.pack(weight)
    assert (packed is not None) == linear_kernel.packs(dtype)
    _check(torch.ops.stepserve.linear(x, weight, bias, packed), x, weight, bias)
    _check(torch.ops.stepserve.linear(x, weight, bias, None), x, weight, bias)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_every_thread_count_gives_the_same_rows(threads):
    built(linear_kernel.load, "linear kernel")
    generator = torch.Generator().manual_seed(threads)
    weight = torch.randn(4099, 256, generator=generator).to(torch.bfloat16)  # not a whole number of tiles
    x = torch.randn(2, 3, 256, generator=generator).to(torch.bfloat16)  # [..., in]: leading dimensions kept
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = torch.ops.stepserve.linear(x, weight, None, None)
        torch.set_num_threads(threads)
        shared = [torch.ops.stepserve.linear(x, weight, None, None) for _ in range(50)]
    finally:
        torch.set_num_threads(before)
    assert alone.shape == (2, 3, 4099)
    _check(alone.view(6, -1), x.view(6, -1), weight, None)
    for y in shared:  # each weight row is one thread's sum, in the same order: bit for bit
        assert torch.equal(y, alone)


def test_the_layers_call_it_compiled_with_their_packed_weights():
    built(linear_kernel.load, "linear kernel")
    from worker_svc.models.layers import Linear
    layer = Linear(64, 96, True, torch.float32)
    torch.nn.init.normal_(layer.weight)
    torch.nn.init.normal_(layer.bias)
    assert linear_kernel.pack_weights(layer) == 1 and layer.packed_weight is not None
    compiled = torch.compile(layer, dynamic=True, fullgraph=True)
    with torch.inference_mode():
        for rows in (2, 8, 16, 40):
            x = torch.randn(rows, 64)
            _check(compiled(x), x, layer.weight, layer.bias)
