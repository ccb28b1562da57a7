"""The CUDA decode attention kernel (worker_svc/triton_decode.py) in Triton's interpreter on CPU,
against attention.py's plain-torch decode (gather the blocks, mask, SDPA): GQA, a block size that
is not a power of two, a sliding window, a soft-cap, float32 and bfloat16, a query with a token
stride (a view of the fused projection), and a block table wider than any context (a CUDA
graph's). Skipped where triton is not installed (it comes with torch's CUDA builds).

The interpreter must be chosen before triton is first imported, so the check runs in a child
process with TRITON_INTERPRET=1."""
import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")

CHECK = r"""
import torch
from worker_svc import triton_decode
from worker_svc.attention import AttentionMetadata, _decode

torch.manual_seed(0)
num_heads, num_kv_heads, head_dim, num_blocks = 4, 2, 16, 24
CASES = [(16, torch.float32, None, None), (16, torch.bfloat16, 7, None),  # (interpreted: slow, so few)
         (6, torch.float32, None, 5.0), (6, torch.float32, 20, 3.0)]
for block_size, dtype, window, softcap in CASES:
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    kv = torch.randn(2, num_blocks, block_size, num_kv_heads, head_dim, dtype=dtype)
    lens = torch.tensor([1, 5, block_size, block_size + 1, 40])
    q = torch.randn(len(lens), 3 * num_heads, head_dim, dtype=dtype)[:, :num_heads]
    tables = torch.randint(0, num_blocks, (len(lens), 12))  # 12 blocks: past every context
    meta = AttentionMetadata(slot_mapping=None, num_tokens=len(lens), num_decode_tokens=len(lens),
                             decode_block_tables=tables, decode_context_lens=lens, prefill=None)
    expected = torch.empty(len(lens), num_heads, head_dim, dtype=dtype)
    _decode(expected, q, kv, meta, head_dim ** -0.5, window, softcap)  # CPU, no C++: torch
    out = torch.empty_like(expected)
    triton_decode.load()(out, q, kv[0], kv[1], tables, lens, head_dim ** -0.5, window or 0, softcap or 0.0)
    error = (out.float() - expected.float()).abs().max().item()
    assert error < tolerance, (block_size, dtype, window, softcap, error)
print("ok")
"""


def test_triton_decode_kernel_equals_torch_attention():
    # the C++ kernel off, so that attention.py's _decode takes its plain-torch path on CPU
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", "import worker_svc.step_kernels as k; k.load = lambda: None\n" + CHECK],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]
