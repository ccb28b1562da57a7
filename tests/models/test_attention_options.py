"""The attention op's per-layer options (sliding window, logit soft-capping, query scale) against
a reference written from their definitions, on both paths: the C++ decode kernel and prefill
(over this step's own K/V and over the gathered cache), in one mixed step.

The reference attends token by token: a query at absolute position p sees keys j with
p - W < j <= p (transformers' sliding mask), scores q.k * scale, capped c * tanh(s / c).
"""
import numpy as np
import pytest
import torch

from tests.native_kernels import built
from worker_svc import attention as attention_module
from worker_svc import step_kernels
from worker_svc.attention import build_attention_metadata, paged_attention

BLOCK_SIZE = 4
NUM_HEADS, NUM_KV_HEADS, HEAD_DIM = 4, 2, 16


def _reference(q, keys, values, position, scale, window, softcap):
    """q [H, D] of the query at `position`; keys/values [P, Hkv, D] of positions 0.. -> [H, D]."""
    first = 0 if window is None else max(0, position - window + 1)
    k = keys[first:position + 1].float().repeat_interleave(NUM_HEADS // NUM_KV_HEADS, dim=1)  # [n, H, D]
    v = values[first:position + 1].float().repeat_interleave(NUM_HEADS // NUM_KV_HEADS, dim=1)
    scores = torch.einsum("hd,nhd->hn", q.float(), k) * scale
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    return torch.einsum("hn,nhd->hd", scores.softmax(-1), v)


def _mixed_step(dtype, seed=0):
    """Two decodes, then a resumed prefill chunk and a fresh prefill: (query_lens, num_computed),
    the whole sequences' q/k/v, and a block table of shuffled blocks per sequence."""
    generator = torch.Generator().manual_seed(seed)
    query_lens = np.array([1, 1, 7, 9])
    num_computed = np.array([22, 5, 13, 0])
    total = query_lens + num_computed
    num_blocks = 64
    order = torch.randperm(num_blocks, generator=generator).tolist()
    tables = np.zeros((len(total), 12), dtype=np.int64)
    for i, n in enumerate(total):
        for b in range(-(-n // BLOCK_SIZE)):
            tables[i, b] = order.pop()
    seqs = [tuple(torch.randn(n, h, HEAD_DIM, generator=generator).to(dtype)
                  for h in (NUM_HEADS, NUM_KV_HEADS, NUM_KV_HEADS)) for n in total]
    return query_lens, num_computed, tables, seqs, num_blocks


def _run_step(dtype, scale, window, softcap, use_kernel, monkeypatch):
    query_lens, num_computed, tables, seqs, num_blocks = _mixed_step(dtype)
    kv_cache = torch.zeros(2, num_blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM, dtype=dtype)
    slots, q_step, k_step, v_step = [], [], [], []
    for i, (q, k, v) in enumerate(seqs):
        start = int(num_computed[i])
        for pos in range(len(q)):  # the earlier tokens' K/V are in the cache already
            slot = tables[i, pos // BLOCK_SIZE] * BLOCK_SIZE + pos % BLOCK_SIZE
            if pos < start:
                kv_cache[0].view(-1, NUM_KV_HEADS, HEAD_DIM)[slot] = k[pos]
                kv_cache[1].view(-1, NUM_KV_HEADS, HEAD_DIM)[slot] = v[pos]
            else:
                slots.append(slot)
        q_step.append(q[start:])
        k_step.append(k[start:])
        v_step.append(v[start:])
    if not use_kernel:
        monkeypatch.setattr(attention_module.step_kernels, "load", lambda: None)
    meta = build_attention_metadata(query_lens, num_computed, tables, np.array(slots), BLOCK_SIZE,
                                    torch.device("cpu"))
    out = paged_attention(torch.cat(q_step), torch.cat(k_step), torch.cat(v_step), kv_cache, meta, scale,
                          window, softcap)
    expected = [_reference(q[p], k, v, p, scale, window, softcap)
                for i, (q, k, v) in enumerate(seqs) for p in range(int(num_computed[i]), len(q))]
    return out.view(-1, NUM_HEADS, HEAD_DIM).float(), torch.stack(expected)


@pytest.mark.parametrize("use_kernel", [True, False], ids=["cpp-kernel", "torch-decode"])
@pytest.mark.parametrize("window,softcap,scale", [(None, None, HEAD_DIM ** -0.5), (6, None, HEAD_DIM ** -0.5),
                                                  (1, None, 0.1), (6, 2.0, 0.3), (None, 2.0, 0.3)])
def test_decode_and_prefill_follow_window_softcap_and_scale(monkeypatch, use_kernel, window, softcap, scale):
    if use_kernel:
        built(step_kernels.load, "decode kernel")
    out, expected = _run_step(torch.float32, scale, window, softcap, use_kernel, monkeypatch)
    torch.testing.assert_close(out, expected, atol=2e-5, rtol=2e-5)


def test_the_window_changes_the_result_and_bfloat16_follows_it(monkeypatch):
    """Every sequence of the step is longer than the window somewhere, so a test that passed
    with the window ignored would fail here; bfloat16 (the kernel's own conversion) stays close."""
    with_window, expected = _run_step(torch.bfloat16, 0.25, 6, 3.0, True, monkeypatch)
    without, _ = _run_step(torch.bfloat16, 0.25, None, 3.0, True, monkeypatch)
    torch.testing.assert_close(with_window, expected, atol=3e-2, rtol=3e-2)
    assert not torch.allclose(with_window, without, atol=0.1)
