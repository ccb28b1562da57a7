"""The caches a model asks the runner to hold: what one model needs (CacheSpec), the tensors
(ModelCaches), how many KV blocks fit, their device and host tensors, swap and copy of blocks.

Layout per attention layer: [2 (k, v), num_blocks, block_size, num_kv_heads, head_dim]. Block
ids are the scheduler's; the worker only moves block contents where a plan tells it to.

The models import this module (a model's cache_spec() returns a CacheSpec), never the other
way round: this module knows no model.
"""
from dataclasses import dataclass, field

import torch

_GiB = 1 << 30


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


def num_blocks_for_tokens(num_tokens, block_size: int):
    """Blocks that hold num_tokens tokens: an int, or a numpy array of counts."""
    return -(-num_tokens // block_size)


def num_blocks_for_bytes(num_bytes: float, spec: CacheSpec, block_size: int,
                         dtype: torch.dtype) -> int:
    if spec.num_attention_layers == 0:
        return 0
    return max(0, int(num_bytes // spec.kv_bytes_per_block(block_size, dtype)))


def num_device_blocks(spec: CacheSpec, block_size: int, dtype: torch.dtype, device: torch.device,
                      kv_cache_gb: float, gpu_memory_utilization: float,
                      reserved_bytes: int = 0) -> int:
    """CPU: kv_cache_gb. CUDA: cuda_kv_budget of the device's memory now."""
    if device.type != "cuda":
        return num_blocks_for_bytes(kv_cache_gb * _GiB, spec, block_size, dtype)
    free, total = torch.cuda.mem_get_info(device)
    budget = cuda_kv_budget(free, total, torch.cuda.memory_reserved(device), gpu_memory_utilization,
                            reserved_bytes)
    return num_blocks_for_bytes(budget, spec, block_size, dtype)


def cuda_kv_budget(free: int, total: int, own_bytes: int, gpu_memory_utilization: float,
                   reserved_bytes: int = 0) -> int:
    """Bytes of KV cache: what is left of this worker's share, utilization * total, after what
    its own torch holds (weights) and `reserved_bytes` (activations), never more than is free.
    vLLM's meaning: a share per worker, whatever other processes hold, so that two replicas on
    one GPU take 0.45 each (the CUDA context, ~0.5 GB, is outside every share)."""
    return int(min(gpu_memory_utilization * total - own_bytes, free) - reserved_bytes)


def allocate_kv(spec: CacheSpec, num_blocks: int, block_size: int, dtype: torch.dtype,
                device: torch.device, pin_memory: bool = False) -> list[torch.Tensor]:
    shape = (2, num_blocks, block_size, spec.num_kv_heads, spec.head_dim)
    # Zeroed, so a padded block-table entry (block 0) never feeds NaN garbage to the softmax.
    return [torch.zeros(shape, dtype=dtype, device=device, pin_memory=pin_memory)
            for _ in range(spec.num_attention_layers)]


def allocate_state(spec: CacheSpec, num_slots: int, dtype: torch.dtype,
                   device: torch.device) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """conv[i]: [num_slots, *conv_state_shape], ssm[i]: [num_slots, *ssm_state_shape]."""
    if not spec.has_state:
        return [], []
    state_dtype = spec.state_dtype or dtype
    conv = [torch.zeros((num_slots, *spec.conv_state_shape), dtype=state_dtype, device=device)
            for _ in range(spec.num_state_layers)]
    ssm = [torch.zeros((num_slots, *spec.ssm_state_shape), dtype=state_dtype, device=device)
           for _ in range(spec.num_state_layers)]
    return conv, ssm


def _pairs(pairs: list[tuple[int, int]]):
    ids = torch.tensor(pairs, dtype=torch.int64)  # [N, 2]: (src, dst)
    return ids[:, 0], ids[:, 1]


def swap_blocks(src_caches: list[torch.Tensor], dst_caches: list[torch.Tensor],
                pairs: list[tuple[int, int]]) -> None:
    """Copy blocks src -> dst between two caches (device -> host, host -> device, or within one
    cache for copy-on-write); every layer's k and v move in one indexed copy."""
    if not pairs:
        return
    src_ids, dst_ids = _pairs(pairs)
    for src, dst in zip(src_caches, dst_caches):
        # blocks: [2, N, block_size, Hkv, D]
        blocks = src[:, src_ids.to(src.device)].to(dst.device, non_blocking=True)
        dst[:, dst_ids.to(dst.device)] = blocks
