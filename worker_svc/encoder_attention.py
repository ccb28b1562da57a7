"""Bidirectional attention for encoder models (BERT, XLM-RoBERTa): every token of a sequence
attends to every token of that sequence, and to no other; nothing is cached.

A step's sequences lie packed on the token axis, each whole (a pooling request runs its prompt
in one step), then padding up to a bucket when compiled:

    [ seq 0 | seq 1 | ... | padding ]

The linear layers run on the packed tokens (no padding work). Attention runs one SDPA over a
[B, H, L, D] layout (L: the longest sequence): a view of the packed tokens when every sequence
has L tokens (a batch of equal inputs, the common case), else a scatter into zeros with a
key mask. On CPU one batched SDPA call beats a call per sequence (measured on 64 x 128 tokens).

Models call `encoder_attention(q, k, v, scale)`, a custom op like attention.py's: a compiled
graph calls it as one opaque op; it reads the step's EncoderMetadata from the forward context.
"""
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from worker_svc.attention import pad_packed
from worker_svc.forward_context import get_forward_context


@dataclass
class EncoderMetadata:
    num_tokens: int  # real tokens: [0, num_tokens); the rest of the token axis is padding
    num_seqs: int
    max_len: int
    # [num_tokens] packed -> row of [num_seqs * max_len]; None: every sequence has max_len tokens
    pad_index: torch.Tensor | None
    key_mask: torch.Tensor | None  # [num_seqs, 1, 1, max_len] bool, True = a real key; None: all are


def build_encoder_metadata(seq_lens: np.ndarray, device: torch.device) -> EncoderMetadata:
    """seq_lens [B]: the tokens of each sequence, in the order they lie on the token axis."""
    num_seqs, num_tokens = len(seq_lens), int(seq_lens.sum())
    max_len = int(seq_lens.max(initial=0))
    pad_index = key_mask = None
    if (seq_lens != max_len).any():
        starts = np.cumsum(seq_lens) - seq_lens
        seq_of_token = np.repeat(np.arange(num_seqs), seq_lens)
        offset = np.arange(num_tokens) - starts[seq_of_token]
        pad_index = torch.from_numpy(seq_of_token * max_len + offset).to(device)
        mask = np.arange(max_len)[None, :] < seq_lens[:, None]  # [B, L]
        key_mask = torch.from_numpy(mask[:, None, None, :]).to(device)
    return EncoderMetadata(num_tokens, num_seqs, max_len, pad_index, key_mask)


def bidirectional_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: EncoderMetadata,
                            scale: float) -> torch.Tensor:
    """q, k, v: [T, H, D] -> [T, H * D]; padding tokens (past meta.num_tokens) get zeros."""
    num_tokens, num_heads, head_dim = q.shape
    real = meta.num_tokens
    if meta.num_seqs == 0:
        return q.new_zeros(num_tokens, num_heads * head_dim)
    layout = [pad_packed(x[:real], meta.pad_index, meta.num_seqs, meta.max_len) for x in (q, k, v)]  # [B, H, L, D]
    out = F.scaled_dot_product_attention(*layout, attn_mask=meta.key_mask, scale=scale)
    out = out.transpose(1, 2).reshape(meta.num_seqs * meta.max_len, num_heads * head_dim)
    if meta.pad_index is not None:
        out = out[meta.pad_index]
    if real < num_tokens:
        out = torch.cat([out, out.new_zeros(num_tokens - real, out.shape[1])])
    return out


@torch.library.custom_op("stepserve::encoder_attention", mutates_args=())
def encoder_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """q, k, v: [T, H, D] -> [T, H * D], over the forward context's encoder_metadata."""
    return bidirectional_attention(q, k, v, get_forward_context().encoder_metadata, scale)


@encoder_attention.register_fake
def _(q, k, v, scale):
    return q.new_empty((q.shape[0], q.shape[1] * q.shape[2]))
