"""What every model offers the runner, and what memory it asks the runner to hold for it.

A model is built from a Hugging Face config.json dict (no transformers import at run time):

    model = ModelClass(config: dict, dtype: torch.dtype)
    model.cache_spec() -> CacheSpec
    model(input_ids, positions) -> hidden  # [T] int64 each -> [T, hidden_size]
    model.compute_logits(hidden)  # [S, hidden] -> [S, vocab] float32
    model.lm_head_weight  # [vocab, hidden]: compute_logits is hidden @ lm_head_weight.T
    model.load_weights(weights: Iterable[tuple[str, torch.Tensor]])  # Hugging Face names

The runner allocates the caches from the spec: one paged KV tensor per attention layer and,
for state-space layers, one conv and one SSM state tensor per layer indexed by state slot. A
forward reads them, and the step's attention metadata and state layout, from the forward
context (worker_svc/forward_context.py) that the runner sets around the call.
"""
from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class CacheSpec:
    num_attention_layers: int
    num_kv_heads: int
    head_dim: int
    num_state_layers: int = 0
    conv_state_shape: tuple[int, ...] = ()  # per slot, e.g. (d_inner, d_conv)
    ssm_state_shape: tuple[int, ...] = ()  # per slot, e.g. (d_inner, d_state)
    # dtype of the conv/ssm state tensors; None: the model's dtype. SSM states are often kept
    # in float32 for accuracy over long sequences.
    state_dtype: torch.dtype | None = None

    @property
    def has_state(self) -> bool:
        return self.num_state_layers > 0

    def kv_bytes_per_block(self, block_size: int, dtype: torch.dtype) -> int:
        per_layer = 2 * block_size * self.num_kv_heads * self.head_dim
        return self.num_attention_layers * per_layer * torch.tensor([], dtype=dtype).element_size()


@dataclass
class ModelCaches:
    # kv[i]: [2, num_blocks, block_size, num_kv_heads, head_dim] for the i-th attention layer
    kv: list[torch.Tensor] = field(default_factory=list)
    # conv[i]: [num_slots, *conv_state_shape], ssm[i]: [num_slots, *ssm_state_shape] for the
    # i-th state-space layer; rows are indexed by the state layout's slots
    conv: list[torch.Tensor] = field(default_factory=list)
    ssm: list[torch.Tensor] = field(default_factory=list)
