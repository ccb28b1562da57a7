"""The C++ bfloat16 prefill attention (worker_svc/csrc/prefill_attention.cpp, AVX512-BF16) against
attention written out in float64 (every score, the mask, the softmax), on random paged layouts:
shuffled blocks, block sizes that do and do not divide the kernel's 16-key blocks, prompts from
one token to past its 128-token work items, chunks that resume after earlier keys (a cached
prefix, a chunked prefill) beside fresh prompts, GQA, sliding windows, soft-capping, head sizes
from 64 to 256, q a strided view of a fused projection. Through the whole model it is checked by
the suites that hold every family's tokens to transformers' (bfloat16 runs of those suites)."""
import numpy as np
import pytest
import torch

from tests.native_kernels import built
from worker_svc import prefill_kernel

CASES = [  # num_heads, num_kv_heads, head_dim, block_size, window, softcap
    (4, 2, 64, 16, None, None),
    (16, 8, 128, 16, None, None),  # Qwen3-0.6B's heads
    (8, 2, 80, 5, 20, 30.0),
    (4, 1, 128, 4, 7, None),
    (2, 2, 256, 16, None, 5.0),
]


def kernel_for(head_dim: int):
    module = built(prefill_kernel.load, "prefill kernel")
    if not module.supports(head_dim):
        pytest.skip("this CPU has no AVX512-BF16: bfloat16 prefills run SDPA here")
    return module


def reference(q, k_cache, v_cache, tables, starts, computed, scale, window, softcap):
    block_size, num_kv_heads, head_dim = k_cache.shape[1:]
    group = q.shape[1] // num_kv_heads
    out = torch.empty(q.shape, dtype=torch.float64)
    for seq in range(len(computed)):
        first, end = int(starts[seq]), int(starts[seq + 1])
        length = int(computed[seq]) + end - first
        positions = torch.arange(length)
        slots = tables[seq, positions // block_size] * block_size + positions % block_size
        keys = k_cache.reshape(-1, num_kv_heads, head_dim)[slots].double().repeat_interleave(group, 1)
        values = v_cache.reshape(-1, num_kv_heads, head_dim)[slots].double().repeat_interleave(group, 1)
        scores = torch.einsum("qhd,khd->hqk", q[first:end].double(), keys) * scale
        if softcap:
            scores = softcap * torch.tanh(scores / softcap)
        query_pos = int(computed[seq]) + torch.arange(end - first)[:, None]
        allowed = positions[None, :] <= query_pos
        if window:
            allowed &= positions[None, :] > query_pos - window
        out[first:end] = torch.einsum("hqk,khd->qhd", scores.masked_fill(~allowed, float("-inf")).softmax(-1), values)
    return out


@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim,block_size,window,softcap", CASES)
def test_prefill_equals_attention_written_out(num_heads, num_kv_heads, head_dim, block_size, window, softcap):
    module = kernel_for(head_dim)
    generator = torch.Generator().manual_seed(head_dim + block_size)
    lens = torch.tensor([1, 17, 40, 200, 3, 33])
    computed = torch.tensor([0, 0, 33, 5, 100, 0])  # resumed chunks and fresh prompts in one step
    num_seqs = len(lens)
    max_blocks = int((lens + computed).max()) // block_size + 2  # wider than any sequence
    tables = torch.randperm(num_seqs * max_blocks, generator=generator).view(num_seqs, max_blocks).contiguous()
    starts = torch.cat([torch.zeros(1, dtype=torch.long), lens.cumsum(0)])
    k_cache, v_cache = (torch.randn(num_seqs * max_blocks, block_size, num_kv_heads, head_dim,
                                    generator=generator).bfloat16() for _ in range(2))
    fused = torch.randn(int(lens.sum()), 3 * num_heads, head_dim, generator=generator).bfloat16()
    q = fused[:, num_heads:2 * num_heads]  # a strided view, as a fused qkv projection's
    out = torch.full(q.shape, float("nan"), dtype=torch.bfloat16)
    scale = head_dim ** -0.5
    module.prefill_attention(out, q, k_cache, v_cache, tables, starts, computed, scale, window or 0, softcap or 0.0)
    expected = reference(q, k_cache, v_cache, tables, starts, computed, scale, window, softcap)
    # bfloat16's rounding of the weights and of the output: SDPA's own error here is the same size
    torch.testing.assert_close(out.double(), expected, atol=2e-2, rtol=2e-2)
    assert (out.double() - expected).abs().mean() < 2e-3


def test_a_block_outside_the_cache_is_an_error_not_a_read():
    module = kernel_for(64)
    k_cache = torch.zeros(4, 16, 2, 64, dtype=torch.bfloat16)
    q = torch.zeros(20, 2, 64, dtype=torch.bfloat16)
    tables = torch.tensor([[0, 9]])  # the second block of the 20 keys is past the cache's 4
    with pytest.raises(RuntimeError, match="outside the cache"):
        module.prefill_attention(torch.empty_like(q), q, k_cache, k_cache.clone(), tables,
                                 torch.tensor([0, 20]), torch.tensor([0]), 0.125)


def test_paged_attention_prefills_through_the_kernel_equal_the_sdpa_path():
    """The wiring: attention.paged_attention on a real step's metadata (decodes, fresh prompts
    and a resumed chunk together) gives the prefill rows SDPA's path gives."""
    kernel_for(128)
    from worker_svc.attention import _prefill, build_attention_metadata, paged_attention
    generator = torch.Generator().manual_seed(7)
    block_size, num_heads, num_kv_heads, head_dim = 16, 16, 8, 128
    query_lens = np.array([1, 1, 37, 5, 130])  # decodes first
    num_computed = np.array([20, 3, 0, 40, 0])
    max_blocks = 12
    block_tables = np.random.default_rng(0).permutation(len(query_lens) * max_blocks).reshape(-1, max_blocks)
    positions = np.concatenate([c + np.arange(n) for c, n in zip(num_computed, query_lens)])
    seq_of_token = np.repeat(np.arange(len(query_lens)), query_lens)
    slots = block_tables[seq_of_token, positions // block_size] * block_size + positions % block_size
    meta = build_attention_metadata(query_lens, num_computed, block_tables, slots, block_size, torch.device("cpu"))
    kv_cache = torch.randn(2, block_tables.size, block_size, num_kv_heads, head_dim, generator=generator).bfloat16()
    num_tokens = int(query_lens.sum())
    q = torch.randn(num_tokens, num_heads, head_dim, generator=generator).bfloat16()
    k, v = (torch.randn(num_tokens, num_kv_heads, head_dim, generator=generator).bfloat16() for _ in range(2))
    scale = head_dim ** -0.5
    out = paged_attention(q, k, v, kv_cache, meta, scale).view(num_tokens, num_heads, head_dim)
    span = slice(meta.prefill.start, meta.prefill.start + meta.prefill.num_tokens)
    expected = _prefill(q[span], k[span], v[span], kv_cache, meta.prefill, scale, None, None)
    torch.testing.assert_close(out[span].float(), expected.float(), atol=2e-2, rtol=2e-2)
