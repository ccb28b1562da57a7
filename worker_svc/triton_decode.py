"""Paged decode attention on CUDA: a Triton kernel over the block tables, the C++ CPU kernel's
counterpart (csrc/paged_decode_attention.cpp, same options; on CUDA the K/V write stays
attention.write_kv's index_copy_).

One program per (decode token, query head) walks its sequence's blocks up to its own context
length with an online softmax in float32: nothing gathered, padded or masked past the context,
and the loop bound is read from `context_lens` on the device, so a captured CUDA graph
(cuda_graphs.py) replays it for any context lengths. The torch fallback in attention.py gathers
every column of the block table, which a graph's full-width table would make max_model_len long.

The kernel is built on first use (triton is imported by CUDA workers only; triton reads
TRITON_INTERPRET when a kernel is defined, which is how the CPU tests run it in the
interpreter). Where triton is missing, `load()` is None and attention.py uses plain torch.
"""
import functools
import logging

import torch

log = logging.getLogger(__name__)


@functools.cache
def load():
    """The launcher `paged_decode_attention(out, q, k_cache, v_cache, block_tables,
    context_lens, scale, sliding_window, softcap)`, or None where triton is not installed."""
    try:
        import triton
        import triton.language as tl
    except ImportError as exc:
        log.warning("triton unavailable (%s): CUDA decode attention uses plain torch, and no CUDA "
                    "graphs are captured", exc)
        return None

    @triton.jit
    def kernel(out_ptr, q_ptr, k_ptr, v_ptr, tables_ptr, lens_ptr,
               q_token_stride, q_head_stride, out_token_stride, out_head_stride,
               kv_block_stride, kv_slot_stride, kv_head_stride, tables_stride,
               scale, window, softcap, group, head_dim, block_size,
               BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, USE_SOFTCAP: tl.constexpr):
        token, head = tl.program_id(0), tl.program_id(1)
        kv_head = head // group
        dims = tl.arange(0, BLOCK_D)
        dim_ok = dims < head_dim
        q = tl.load(q_ptr + token * q_token_stride + head * q_head_stride + dims, mask=dim_ok,
                    other=0.0).to(tl.float32)
        context_len = tl.load(lens_ptr + token)
        first_key = tl.maximum(context_len - window, 0)  # the last W keys, the query's own included
        slots = tl.arange(0, BLOCK_N)  # BLOCK_N: block_size rounded up to a power of two
        in_block = slots < block_size
        running_max = tl.full((), -float("inf"), tl.float32)
        denominator = tl.zeros((), tl.float32)
        acc = tl.zeros((BLOCK_D,), tl.float32)
        # The first block holds key first_key (< context_len): running_max is finite after it.
        for block in range(first_key // block_size, tl.cdiv(context_len, block_size)):
            block_id = tl.load(tables_ptr + token * tables_stride + block)
            keys = block * block_size + slots
            valid = in_block & (keys < context_len) & (keys >= first_key)
            offsets = (block_id * kv_block_stride + slots[:, None] * kv_slot_stride
                       + kv_head * kv_head_stride + dims[None, :])
            load_mask = valid[:, None] & dim_ok[None, :]
            k = tl.load(k_ptr + offsets, mask=load_mask, other=0.0).to(tl.float32)
            scores = tl.sum(k * q[None, :], axis=1) * scale  # [BLOCK_N]
            if USE_SOFTCAP:
                # tanh(x) = 2 sigmoid(2x) - 1 (tl has no tanh on every backend)
                scores = softcap * (2.0 * tl.sigmoid(2.0 * scores / softcap) - 1.0)
            scores = tl.where(valid, scores, -float("inf"))
            new_max = tl.maximum(running_max, tl.max(scores, axis=0))
            rescale = tl.exp(running_max - new_max)
            weights = tl.exp(scores - new_max)
            v = tl.load(v_ptr + offsets, mask=load_mask, other=0.0).to(tl.float32)
            acc = acc * rescale + tl.sum(weights[:, None] * v, axis=0)
            denominator = denominator * rescale + tl.sum(weights, axis=0)
            running_max = new_max
        out = acc / denominator
        tl.store(out_ptr + token * out_token_stride + head * out_head_stride + dims,
                 out.to(out_ptr.dtype.element_ty), mask=dim_ok)

    def paged_decode_attention(out: torch.Tensor, q: torch.Tensor, k_cache: torch.Tensor,
                               v_cache: torch.Tensor, block_tables: torch.Tensor,
                               context_lens: torch.Tensor, scale: float, sliding_window: int,
                               softcap: float) -> None:
        """out, q: [T, H, D] (D contiguous); k_cache, v_cache: [NB, BS, Hkv, D]; block_tables
        [T, MB] int64 (only the blocks under each context length are read); context_lens [T]
        int64 (>= 1); sliding_window, softcap: 0 turns each off. Writes out in place."""
        num_tokens, num_heads, head_dim = q.shape
        block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
        kernel[(num_tokens, num_heads)](
            out, q, k_cache, v_cache, block_tables, context_lens,
            q.stride(0), q.stride(1), out.stride(0), out.stride(1),
            k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0),
            # no window: one wider than any context (a 32-bit argument)
            scale, sliding_window or (1 << 30), softcap, num_heads // num_kv_heads, head_dim, block_size,
            BLOCK_N=triton.next_power_of_2(block_size), BLOCK_D=triton.next_power_of_2(head_dim),
            USE_SOFTCAP=softcap > 0)

    return paged_decode_attention
