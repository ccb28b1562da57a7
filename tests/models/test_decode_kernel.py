"""The C++ step kernel (worker_svc/csrc/paged_decode_attention.cpp: the K/V write and the decode
attention in one call) against what it replaced: index_copy_ of the step's K/V at their slots
(attention.write_kv), then attention.py's plain-torch decode (gather the blocks, mask, SDPA), on
random paged layouts: shuffled blocks, contexts from one key to several blocks, GQA, sliding
windows, soft-capping, float32 and bfloat16, head sizes on the vectorised path (multiples of 16,
more than one 64-lane chunk) and off it, contexts walked per query head and (a sequence's K/V
past 128 KiB) per key, q/k/v as strided views of a fused projection, and a
step whose rows are decodes, then prefill tokens (written, not attended), then padding (zeros)."""
import numpy as np
import pytest
import torch

from tests.native_kernels import built
from worker_svc import step_kernels
from worker_svc.attention import AttentionMetadata, _decode, write_kv

CASES = [  # num_heads, num_kv_heads, head_dim, block_size, dtype, window, softcap
    (2, 2, 64, 16, torch.float32, None, None),  # micro-llama's shape
    (4, 2, 64, 16, torch.bfloat16, None, None),
    (8, 2, 80, 16, torch.float32, 7, None),  # 64 + 16 lanes
    (4, 1, 128, 4, torch.bfloat16, 20, 30.0),
    (4, 2, 24, 5, torch.float32, None, 5.0),  # off the vectorised path
    (3, 3, 32, 16, torch.float16, None, None),
    # Qwen3-0.6B's heads: past 32 keys a sequence's K/V outgrow 128 KiB, where the kernel walks
    # each key once for all heads (scores_by_key, values_by_key); shorter ones walk per head
    (16, 8, 128, 16, torch.bfloat16, None, None),
    (8, 4, 128, 16, torch.float32, 40, 30.0),
    (6, 2, 128, 16, torch.float32, None, None),  # per key, 3 heads a KV head: one head at a time
]


@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim,block_size,dtype,window,softcap", CASES)
def test_write_and_decode_equals_index_copy_then_torch_decode(num_heads, num_kv_heads, head_dim, block_size,
                                                              dtype, window, softcap):
    check_write_and_decode(num_heads, num_kv_heads, head_dim, block_size, dtype, window, softcap,
                           num_decode=37, max_len=6 * block_size)


@pytest.mark.parametrize("num_decode", [1, 3])
@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim,block_size,dtype,window,softcap",
                         [CASES[0], CASES[1], CASES[6], CASES[8]])  # unwindowed: a window keeps the work small
def test_a_step_of_few_tokens_shares_their_heads_between_threads(num_decode, num_heads, num_kv_heads, head_dim,
                                                                  block_size, dtype, window, softcap):
    """Fewer tokens than twice the threads: each token's KV heads are split into parts (one
    user's step); contexts long enough for the step to go to the threads at all."""
    parallel_work = 1 << 18  # the kernel's kParallelWork: below it a step runs on the caller
    max_len = 4 * parallel_work // (num_decode * num_heads * head_dim)  # half of it at least
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)  # the kernel's threads: as many as torch's
        check_write_and_decode(num_heads, num_kv_heads, head_dim, block_size, dtype, window, softcap,
                               num_decode=num_decode, max_len=max_len)
    finally:
        torch.set_num_threads(before)


def check_write_and_decode(num_heads, num_kv_heads, head_dim, block_size, dtype, window, softcap, num_decode,
                           max_len):
    module = built(step_kernels.load, "decode kernel")
    generator = torch.Generator().manual_seed(head_dim + block_size + num_decode)
    num_prefill, num_padding = 5, 3
    lens = torch.randint(max_len // 2, max_len, (num_decode,), generator=generator)
    if num_decode > 3:
        lens = torch.randint(1, max_len, (num_decode,), generator=generator)
        lens[:3] = torch.tensor([1, block_size, block_size + 1])
    max_blocks = -(-int(lens.max()) // block_size) + 2  # wider than any context
    spare_blocks = -(-(num_prefill + num_padding) // block_size)  # prefill and scratch slots: distinct
    num_blocks = num_decode * max_blocks + spare_blocks
    order = torch.randperm(num_blocks - spare_blocks, generator=generator)
    tables = order[:num_decode * max_blocks].view(num_decode, max_blocks).contiguous()
    last = lens - 1
    decode_slots = tables[torch.arange(num_decode), last // block_size] * block_size + last % block_size
    other_slots = (num_blocks - spare_blocks) * block_size + torch.arange(num_prefill + num_padding)
    slots = torch.cat([decode_slots, other_slots])
    num_tokens = num_decode + num_prefill + num_padding
    fused = torch.randn(num_tokens, (num_heads + 2 * num_kv_heads) * 2, head_dim, generator=generator).to(dtype)
    q = fused[:, :num_heads]  # strided views, as a fused qkv projection's are
    k = fused[:, num_heads:num_heads + num_kv_heads]
    v = fused[:, 2 * num_heads:2 * num_heads + num_kv_heads]
    kv_cache = torch.randn(2, num_blocks, block_size, num_kv_heads, head_dim, generator=generator).to(dtype)
    scale = head_dim ** -0.5
    num_write = num_decode + num_prefill

    expected_cache = kv_cache.clone()
    write_kv(expected_cache, slots[:num_write], k[:num_write], v[:num_write])
    meta = AttentionMetadata(slot_mapping=slots, num_tokens=num_write, num_decode_tokens=num_decode,
                             decode_block_tables=tables, decode_context_lens=lens, prefill=None)
    expected = torch.empty(num_decode, num_heads, head_dim, dtype=dtype)
    _decode(expected, q[:num_decode], expected_cache, meta, scale, window, softcap)  # CPU: plain torch

    out = torch.full((num_tokens, num_heads, head_dim), float("nan"), dtype=dtype)
    module.write_kv_and_decode(out, q, k, v, kv_cache[0], kv_cache[1], slots, num_write, tables, lens, scale,
                               window or 0, softcap or 0.0)
    assert torch.equal(kv_cache, expected_cache)  # every written row at its slot, nothing else touched
    tolerance = 2e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out[:num_decode].float(), expected.float(), atol=tolerance, rtol=tolerance)
    assert out[num_decode:num_write].isnan().all()  # prefill rows are the caller's
    assert (out[num_write:] == 0).all()  # padding


def test_a_slot_outside_the_cache_is_an_error_not_a_write():
    module = built(step_kernels.load, "decode kernel")
    kv_cache = torch.zeros(2, 4, 16, 2, 64)
    q, k, v = torch.randn(1, 2, 64), torch.randn(1, 2, 64), torch.randn(1, 2, 64)
    with pytest.raises(RuntimeError, match="out of range"):
        module.write_kv_and_decode(torch.empty_like(q), q, k, v, kv_cache[0], kv_cache[1], torch.tensor([64]), 1,
                                   torch.zeros(1, 1, dtype=torch.int64), torch.tensor([1]), 0.125)
    assert not kv_cache.any()


def test_the_exponential_follows_torch_over_the_softmax_range():
    """The kernel's polynomial exp, seen through a softmax over scores spread over [-90, 0]."""
    module = built(step_kernels.load, "decode kernel")
    scores = torch.from_numpy(np.linspace(-90.0, 0.0, 4001, dtype=np.float32))
    # one head, head_dim 16: key j = [scores[j], 0, ...], query = [1, 0, ...], scale 1 -> score j;
    # values = one-hot of j % 16, so the output is the softmax summed per residue class
    n, block_size = len(scores), 16
    k_cache = torch.zeros(-(-n // block_size) + 1, block_size, 1, 16)
    v_cache = torch.zeros_like(k_cache)
    k_cache.view(-1, 16)[:n, 0] = scores
    v_cache.view(-1, 16)[torch.arange(n), torch.arange(n) % 16] = 1.0
    q = torch.zeros(1, 1, 16)
    q[0, 0, 0] = 1.0
    tables = torch.arange(k_cache.shape[0] - 1).view(1, -1)
    out = torch.empty_like(q)
    spare = torch.tensor([(k_cache.shape[0] - 1) * block_size])  # the written row goes to a spare block
    module.write_kv_and_decode(out, q, torch.zeros(1, 1, 16), torch.zeros(1, 1, 16), k_cache, v_cache, spare, 1,
                               tables, torch.tensor([n]), 1.0)
    expected = torch.zeros(16).index_add_(0, torch.arange(n) % 16, scores.double().softmax(0).float())
    torch.testing.assert_close(out[0, 0], expected, atol=1e-6, rtol=1e-5)
