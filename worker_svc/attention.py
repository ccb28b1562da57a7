"""Paged attention: K/V written by slot mapping, read back through block tables.

One forward mixes decodes (one query token per sequence) and prefills (or prefill chunks). The
runner orders a step's sequences decodes first, so the token axis of a forward is

    [ decode tokens | prefill tokens | padding (shapes are padded to a bucket) ]

and one AttentionMetadata per step, built in numpy and shared by every attention layer, says
where each part lies:
- decodes run a paged kernel whose cost follows each sequence's own context length (no gather,
  no padding, no mask): C++ on CPU (step_kernels.py; the same call stores the step's K/V, so a
  layer's write and decode are one native call), Triton on CUDA (triton_decode.py); plain torch
  where neither is available (gather the blocks, mask past each context, SDPA);
- prefills in bfloat16 on a CPU with AVX512-BF16 run a flash-style C++ kernel (prefill_kernel.py)
  that reads every key from the cache through the block tables (this step's K/V are written
  first), causal in absolute positions (a later chunk, or a prompt after a cached prefix, sees
  the earlier keys); the others scaled_dot_product_attention over a padded [B, Q] layout: causal
  over this step's own K/V when every prefill starts at token 0, otherwise over K/V read from the
  cache under a mask that is causal in absolute positions;
- padding tokens write their K/V to a scratch slot no request owns (the C++ call skips them:
  nothing reads that slot), and get zeros.

Models call `attention(q, k, v, layer_index, scale, sliding_window, softcap)`, a custom op: a
compiled graph calls it as one opaque op, and it reads the step's metadata and the layer's cache
from the forward context. The options are a layer's own, constants of the graph:
- scale: the query scale (head_dim ** -0.5, or Gemma's query_pre_attn_scalar ** -0.5);
- sliding_window W (None: global): each query attends its last W positions, itself included
  (transformers' sliding mask, key > query - W): Mistral's sliding_window, Gemma's local layers;
- softcap c (None: off): scores become c * tanh(score / c) before the softmax (Gemma 2).
Both paths honour them: the C++ decode kernel walks only the window's keys, prefill masks them.

Blocks wholly behind every layer's window are NOT freed early: a sequence keeps all its blocks
until it finishes or is preempted. The scheduler (torch-free) owns the block tables and knows no
windows; freeing would need it to learn each model's per-layer windows, and a model with any
global layer (Gemma) could free nothing anyway. Keeping them is the simple exact choice; the
decode kernel still skips them, so a windowed layer's decode cost is bounded by its window.
"""
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from worker_svc import prefill_kernel, step_kernels, triton_decode
from worker_svc.forward_context import get_forward_context
from worker_svc.kv_cache import num_blocks_for_tokens


@dataclass
class PrefillMetadata:
    start: int  # index of the first prefill token on the token axis
    num_tokens: int
    num_seqs: int
    max_query_len: int
    # [num_tokens] packed -> row of [num_seqs * Q]; None: every sequence has Q tokens (one
    # sequence, or a wave of equal prompts), so the packed tokens are the padded layout already
    pad_index: torch.Tensor | None
    block_tables: torch.Tensor  # [num_seqs, max_blocks]: the blocks of each sequence's keys
    query_starts: torch.Tensor  # [num_seqs + 1]: sequence i's tokens are [starts[i], starts[i + 1])
    num_computed: torch.Tensor  # [num_seqs]: the position of each sequence's first token here
    # Some prefill resumes (computed tokens > 0): the torch path reads K/V from the cache; else
    # it attends causally to this step's own K/V. (The C++ kernel always reads the cache.)
    resumes: bool
    # Absolute position of each row of the padded query layout: [num_seqs, Q] when reading the
    # cache, [1, Q] (0 .. Q - 1, the same for every sequence) over this step's own K/V.
    query_positions: torch.Tensor
    num_keys: int  # keys each sequence's row of K/V holds: max_blocks * block_size, or Q
    _masks: dict = field(default_factory=dict)  # sliding_window -> mask, built once per step

    def mask(self, sliding_window: int | None) -> torch.Tensor | None:
        """[B or 1, 1, Q, num_keys] bool, True = attend: causal in absolute positions, within the
        window if any; None where SDPA's own causal mask says it (this step's K/V, no window).
        Built on the first layer that asks, shared by the step's other layers."""
        if sliding_window is None and not self.resumes:
            return None
        if sliding_window not in self._masks:
            query_pos = self.query_positions[:, :, None]  # [B, Q, 1]
            key_pos = torch.arange(self.num_keys, device=query_pos.device)
            allowed = key_pos <= query_pos
            if sliding_window is not None:
                allowed &= key_pos > query_pos - sliding_window
            self._masks[sliding_window] = allowed[:, None]
        return self._masks[sliding_window]


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [T] KV slot of every token, padding included
    num_tokens: int  # real tokens: [0, num_tokens); the rest of T is padding
    num_decode_tokens: int  # decodes: [0, num_decode_tokens)
    decode_block_tables: torch.Tensor  # [num_decode_tokens, max_blocks] int64
    decode_context_lens: torch.Tensor  # [num_decode_tokens] int64, keys each decode sees
    prefill: PrefillMetadata | None


def build_attention_metadata(query_lens: np.ndarray, num_computed: np.ndarray,
                             block_tables: np.ndarray, slot_mapping: np.ndarray, block_size: int,
                             device: torch.device) -> AttentionMetadata:
    """Per sequence, decodes (query_len 1) first: query_lens, num_computed [B], block_tables
    [B, >= blocks needed]; slot_mapping [T] for every token of the (padded) forward."""
    def tensor(array: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(array)).to(device, non_blocking=True)

    num_decode = int(np.count_nonzero(query_lens == 1))
    assert (query_lens[:num_decode] == 1).all(), "decodes come first"
    context_lens = num_computed + query_lens
    decode_blocks = num_blocks_for_tokens(int(context_lens[:num_decode].max(initial=1)), block_size)
    prefill = None
    if num_decode < len(query_lens):
        prefill = _prefill_metadata(query_lens[num_decode:], num_computed[num_decode:],
                                    block_tables[num_decode:], num_decode, block_size, tensor)
    return AttentionMetadata(
        slot_mapping=tensor(slot_mapping), num_tokens=int(query_lens.sum()),
        num_decode_tokens=num_decode,
        decode_block_tables=tensor(block_tables[:num_decode, :decode_blocks]),
        decode_context_lens=tensor(context_lens[:num_decode]), prefill=prefill)


def _prefill_metadata(query_lens, num_computed, block_tables, start, block_size, tensor):
    num_seqs, num_tokens = len(query_lens), int(query_lens.sum())
    max_query_len = int(query_lens.max())
    pad_index = None
    if (query_lens != max_query_len).any():
        starts = np.cumsum(query_lens) - query_lens
        seq_of_token = np.repeat(np.arange(num_seqs), query_lens)
        offset_in_seq = np.arange(num_tokens) - starts[seq_of_token]
        pad_index = tensor(seq_of_token * max_query_len + offset_in_seq)
    max_blocks = num_blocks_for_tokens(int((num_computed + query_lens).max()), block_size)
    resumes = bool(num_computed.any())
    if resumes:
        query_pos, num_keys = num_computed[:, None] + np.arange(max_query_len), max_blocks * block_size
    else:
        query_pos, num_keys = np.arange(max_query_len)[None, :], max_query_len
    query_starts = np.concatenate([[0], np.cumsum(query_lens)]).astype(np.int64)
    return PrefillMetadata(start, num_tokens, num_seqs, max_query_len, pad_index, tensor(block_tables[:, :max_blocks]),
                           tensor(query_starts), tensor(num_computed.astype(np.int64)), resumes, tensor(query_pos),
                           num_keys)


def write_kv(kv_cache: torch.Tensor, slot_mapping: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    """kv_cache: [2, num_blocks, block_size, Hkv, D]; k, v: [T, Hkv, D] stored at their slots."""
    num_kv_heads, head_dim = kv_cache.shape[-2:]
    kv_cache[0].view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, k)
    kv_cache[1].view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, v)


def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
                    meta: AttentionMetadata, scale: float, sliding_window: int | None = None,
                    softcap: float | None = None) -> torch.Tensor:
    """q: [T, H, D], k/v: [T, Hkv, D] (this step's tokens) -> out [T, H * D].

    The new K/V are written first, so decodes and resumed prefills read their whole context
    from the cache. On CPU one C++ call writes them and runs the decodes (step_kernels.py)."""
    num_tokens, num_heads, head_dim = q.shape
    out = q.new_empty(num_tokens, num_heads, head_dim)
    if q.device.type == "cpu" and (module := step_kernels.load()) is not None:
        # stores the real tokens' K/V (not the padding's), attends the decodes, zeros the padding
        q_rows, k_rows, v_rows = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
        module.write_kv_and_decode(out, q_rows, k_rows, v_rows, kv_cache[0], kv_cache[1], meta.slot_mapping,
                                   meta.num_tokens, meta.decode_block_tables, meta.decode_context_lens, scale,
                                   sliding_window or 0, softcap or 0.0)
    else:
        write_kv(kv_cache, meta.slot_mapping, k, v)
        out[meta.num_tokens:] = 0  # padding
        if meta.num_decode_tokens:
            _decode(out[:meta.num_decode_tokens], q[:meta.num_decode_tokens], kv_cache, meta, scale,
                    sliding_window, softcap)
    prefill = meta.prefill
    if prefill is not None:
        span = slice(prefill.start, prefill.start + prefill.num_tokens)
        kernel = prefill_kernel.load() if q.device.type == "cpu" and q.dtype == torch.bfloat16 else None
        if kernel is not None and kernel.supports(head_dim):
            # the step's K/V are in the cache by now: the kernel reads every key from there
            kernel.prefill_attention(out[span], q[span], kv_cache[0], kv_cache[1], prefill.block_tables,
                                     prefill.query_starts, prefill.num_computed, scale, sliding_window or 0,
                                     softcap or 0.0)
        else:
            out[span] = _prefill(q[span], k[span], v[span], kv_cache, prefill, scale, sliding_window, softcap)
    return out.view(num_tokens, num_heads * head_dim)


def _decode(out, q, kv_cache, meta: AttentionMetadata, scale: float, sliding_window: int | None,
            softcap: float | None) -> None:
    """Decodes off the CPU kernel's path: the Triton kernel on CUDA, else plain torch."""
    kernel = triton_decode.load() if q.device.type == "cuda" else None
    if kernel is not None:
        q = q if q.stride(-1) == 1 else q.contiguous()
        kernel(out, q, kv_cache[0], kv_cache[1], meta.decode_block_tables, meta.decode_context_lens,
               scale, sliding_window or 0, softcap or 0.0)
        return
    keys, values = _gather_kv(kv_cache, meta.decode_block_tables)  # [B, Hkv, K, D]
    key_pos = torch.arange(keys.shape[2], device=q.device)
    context_lens = meta.decode_context_lens[:, None]
    mask = key_pos[None, :] < context_lens  # [B, K]
    if sliding_window is not None:
        mask &= key_pos[None, :] >= context_lens - sliding_window
    out.copy_(_attend(q[:, :, None, :], keys, values, mask[:, None, None, :], scale, softcap)[:, :, 0, :])


def _prefill(q, k, v, kv_cache, meta: PrefillMetadata, scale: float, sliding_window: int | None,
             softcap: float | None) -> torch.Tensor:
    num_heads, head_dim = q.shape[1:]
    num_seqs, max_query_len = meta.num_seqs, meta.max_query_len
    q_padded = _pad(q, meta)  # [B, H, Q, D]
    if not meta.resumes:
        keys, values = _pad(k, meta), _pad(v, meta)
    else:
        keys, values = _gather_kv(kv_cache, meta.block_tables)
    out = _attend(q_padded, keys, values, meta.mask(sliding_window), scale, softcap)  # [B, H, Q, D]
    out = out.transpose(1, 2).reshape(num_seqs * max_query_len, num_heads, head_dim)
    return out if meta.pad_index is None else out[meta.pad_index]


def _attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None,
            scale: float, softcap: float | None) -> torch.Tensor:
    """q [B, H, Q, D] over keys/values [B, Hkv, K, D] -> [B, H, Q, D]; mask broadcasts to
    [B, 1, Q, K] (True = attend), None: causal. SDPA has no soft-capping, so a capped layer
    computes the scores itself, as transformers' eager attention does (softmax in float32)."""
    num_heads, num_kv_heads = q.shape[1], keys.shape[1]
    if softcap is None:
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, is_causal=mask is None,
                                              scale=scale, enable_gqa=num_heads != num_kv_heads)
    group = num_heads // num_kv_heads
    keys, values = keys.repeat_interleave(group, dim=1), values.repeat_interleave(group, dim=1)
    scores = torch.tanh(q @ keys.transpose(-1, -2) * (scale / softcap)) * softcap  # [B, H, Q, K]
    if mask is None:
        mask = torch.ones(scores.shape[-2:], dtype=torch.bool, device=q.device).tril()
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype) @ values


def _pad(x: torch.Tensor, meta: PrefillMetadata) -> torch.Tensor:
    return pad_packed(x, meta.pad_index, meta.num_seqs, meta.max_query_len)


def pad_packed(x: torch.Tensor, pad_index: torch.Tensor | None, num_seqs: int, max_len: int) -> torch.Tensor:
    """Packed [n, heads, D] -> [B, heads, L, D], zeros past each sequence's end (pad_index: each
    packed token's place in the [B * L] layout; None when every sequence is L long)."""
    if pad_index is not None:
        padded = x.new_zeros(num_seqs * max_len, *x.shape[1:])
        padded[pad_index] = x
        x = padded
    return x.view(num_seqs, max_len, *x.shape[1:]).transpose(1, 2)


def _gather_kv(kv_cache: torch.Tensor, block_tables: torch.Tensor):
    """Blocks of each row of block_tables -> keys, values [B, Hkv, max_blocks * block_size, D].
    index_select on flat block ids is ~2.5x faster on CPU than indexing with the 2-D table."""
    num_seqs = block_tables.shape[0]
    num_kv_heads, head_dim = kv_cache.shape[-2:]
    flat = block_tables.reshape(-1)
    shape = (num_seqs, -1, num_kv_heads, head_dim)
    keys = kv_cache[0].index_select(0, flat).view(shape).transpose(1, 2)
    values = kv_cache[1].index_select(0, flat).view(shape).transpose(1, 2)
    return keys, values


@torch.library.custom_op("stepserve::attention", mutates_args=())
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_index: int, scale: float,
              sliding_window: int | None = None, softcap: float | None = None) -> torch.Tensor:
    """q: [T, H, D], k/v: [T, Hkv, D] -> [T, H * D]; writes this step's K/V into the layer's
    cache (the forward context's caches.kv[layer_index]), which the op owns: no other op reads
    or writes it, so the compiler may treat the op as pure. The cache is no argument, so there
    is nothing for mutates_args to name; inductor can neither drop a call (its output is always
    used) nor merge two (each layer's layer_index differs), and the write happens inside the
    call, before its reads. sliding_window, softcap: the layer's options (module docstring)."""
    context = get_forward_context()
    return paged_attention(q, k, v, context.caches.kv[layer_index], context.attn_metadata, scale,
                           sliding_window, softcap)


@attention.register_fake
def _(q, k, v, layer_index, scale, sliding_window=None, softcap=None):
    return q.new_empty((q.shape[0], q.shape[1] * q.shape[2]))
