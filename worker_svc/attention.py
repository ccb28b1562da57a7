"""Paged attention in plain torch: K/V written by slot mapping, read back through block tables.

One batch mixes prefills, prefill chunks and decodes. Each sequence's queries are padded to the
batch's longest query and attend to its gathered KV blocks under a mask that is causal in
absolute positions: query i of a sequence sits at position num_computed + i and sees keys
0..num_computed + i, so a later prefill chunk attends to the earlier chunks' KV in the cache.
The metadata is built once per forward and shared by every attention layer.
"""
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from worker_svc.forward_batch import ForwardBatch


@dataclass
class AttentionMetadata:
    num_seqs: int
    max_query_len: int
    pad_index: torch.Tensor | None  # [T] packed token -> row of [B * max_query_len]; None: decode
    mask: torch.Tensor  # [B, 1, max_query_len, max_kv_len] bool, True = attend
    block_tables: torch.Tensor  # [B, max_blocks]
    slot_mapping: torch.Tensor  # [T]


def attention_metadata(batch: ForwardBatch, block_size: int) -> AttentionMetadata:
    """Built on the first attention layer of a forward, cached on the batch for the others."""
    if batch.attn_metadata is not None:
        return batch.attn_metadata
    device = batch.input_ids.device
    num_seqs = batch.num_seqs
    max_query_len = max(batch.query_lens)
    pad_index = None
    if max_query_len > 1:
        # Row of each packed token in the padded [B, max_query_len] query layout.
        seq_of_token = torch.repeat_interleave(
            torch.arange(num_seqs, device=device),
            torch.tensor(batch.query_lens, device=device), output_size=batch.num_tokens)
        offset_in_seq = torch.arange(batch.num_tokens, device=device) - batch.query_start_loc[seq_of_token]
        pad_index = seq_of_token * max_query_len + offset_in_seq
    max_kv_len = batch.block_tables.shape[1] * block_size
    first_query_pos = batch.context_lens - torch.tensor(batch.query_lens, device=device)  # [B]
    query_pos = first_query_pos[:, None] + torch.arange(max_query_len, device=device)  # [B, Q]
    key_pos = torch.arange(max_kv_len, device=device)
    mask = (key_pos[None, None, :] <= query_pos[:, :, None]).unsqueeze(1)  # [B, 1, Q, K]
    batch.attn_metadata = AttentionMetadata(num_seqs, max_query_len, pad_index, mask,
                                            batch.block_tables, batch.slot_mapping)
    return batch.attn_metadata


def write_kv(kv_cache: torch.Tensor, slot_mapping: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    """kv_cache: [2, num_blocks, block_size, Hkv, D]; k, v: [T, Hkv, D] stored at their slots."""
    num_kv_heads, head_dim = kv_cache.shape[-2:]
    kv_cache[0].view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, k)
    kv_cache[1].view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, v)


def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
                    meta: AttentionMetadata, scale: float | None = None) -> torch.Tensor:
    """q: [T, H, D], k/v: [T, Hkv, D] (this step's tokens) -> out [T, H * D].

    The new K/V are written first, so each sequence reads its whole context from the cache.
    """
    write_kv(kv_cache, meta.slot_mapping, k, v)
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = kv_cache.shape[-2]
    num_seqs, max_query_len = meta.num_seqs, meta.max_query_len
    # keys/values: [B * max_blocks, block_size, Hkv, D] -> [B, Hkv, max_kv_len, D]. index_select
    # on flat block ids is ~2.5x faster on CPU than advanced indexing with the 2-D table.
    flat_blocks = meta.block_tables.reshape(-1)
    kv_shape = (num_seqs, -1, num_kv_heads, head_dim)
    keys = kv_cache[0].index_select(0, flat_blocks).view(kv_shape).transpose(1, 2)
    values = kv_cache[1].index_select(0, flat_blocks).view(kv_shape).transpose(1, 2)
    if meta.pad_index is None:
        q_padded = q  # decode only: one query per sequence, already one row each
    else:
        q_padded = q.new_zeros(num_seqs * max_query_len, num_heads, head_dim)
        q_padded[meta.pad_index] = q
    q_padded = q_padded.view(num_seqs, max_query_len, num_heads, head_dim).transpose(1, 2)
    out = F.scaled_dot_product_attention(  # [B, H, Q, D]
        q_padded, keys, values, attn_mask=meta.mask, scale=scale,
        enable_gqa=num_heads != num_kv_heads)
    out = out.transpose(1, 2).reshape(num_seqs * max_query_len, num_heads * head_dim)
    if meta.pad_index is not None:
        out = out[meta.pad_index]
    return out
