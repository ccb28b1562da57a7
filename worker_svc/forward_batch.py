"""ForwardBatch: the flattened tensors one model forward needs, built by the runner per step.

Sequences are packed back to back along one token axis (no padding): sequence i owns tokens
query_start_loc[i] : query_start_loc[i + 1]. A decoding sequence has query_len 1; a prefill
(or prefill chunk) has query_len > 1; both kinds mix in one batch.
"""
from dataclasses import dataclass

import torch


@dataclass
class ForwardBatch:
    input_ids: torch.Tensor  # [T] int64, new tokens of every sequence, packed
    positions: torch.Tensor  # [T] int64, position of each token in its sequence
    query_start_loc: torch.Tensor  # [B + 1] int64, prefix sums of query_lens
    query_lens: list[int]  # [B] new tokens per sequence this step
    context_lens: torch.Tensor  # [B] int64, tokens in KV after this step (computed + new)
    num_computed_tokens: list[int]  # [B] tokens already in KV / state before this step
    slot_mapping: torch.Tensor  # [T] int64, KV slot of each new token: block * block_size + offset
    block_tables: torch.Tensor  # [B, max_blocks] int64, padded with 0 past a sequence's blocks
    logits_indices: torch.Tensor  # [S] int64, index into T of each sampled sequence's last token
    state_slots: torch.Tensor | None = None  # [B] int64, Mamba state slot of each sequence
    # Built by attention.attention_metadata on a forward's first attention layer, shared by the
    # rest; models without attention never touch it.
    attn_metadata: object | None = None

    @property
    def num_seqs(self) -> int:
        return len(self.query_lens)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def is_decode_only(self) -> bool:
        return self.num_tokens == self.num_seqs
