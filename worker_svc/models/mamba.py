"""Mamba (v1) causal LM, the `MambaForCausalLM` of a Hugging Face config.json.

Every layer is a state-space layer: RMSNorm -> MambaMixer -> residual. No attention, so no KV
cache; the runner holds one conv and one SSM state tensor per layer, indexed by state slot.
"""
import math

import torch
from torch import nn

from worker_svc.forward_context import get_forward_context
from worker_svc.kv_cache import CacheSpec
from worker_svc.models.base import CausalLM
from worker_svc.models.layers import Embedding, Linear, RMSNorm
from worker_svc.models.mamba_mixer import STATE_DTYPE, MambaMixer
from worker_svc.parallel import TensorParallel


class MambaBlock(nn.Module):
    def __init__(self, cfg: dict, dtype: torch.dtype):
        super().__init__()
        hidden = cfg["hidden_size"]
        d_inner = cfg.get("intermediate_size") or cfg.get("expand", 2) * hidden
        dt_rank = cfg.get("time_step_rank", "auto")
        dt_rank = math.ceil(hidden / 16) if dt_rank == "auto" else int(dt_rank)
        self.norm = RMSNorm(hidden, cfg.get("layer_norm_epsilon", 1e-5), dtype)
        self.mixer = MambaMixer(
            hidden, d_inner, cfg.get("state_size", 16), cfg.get("conv_kernel", 4), dt_rank,
            conv_bias=cfg.get("use_conv_bias", True), proj_bias=cfg.get("use_bias", False), dtype=dtype)

    def forward(self, residual, layout, conv_state, ssm_state, dtype):
        hidden = self.mixer(self.norm(residual.to(dtype)), layout, conv_state, ssm_state)
        return residual + hidden  # keeps the residual's dtype (float32 when residual_in_fp32)


class MambaForCausalLM(CausalLM):
    input_embedding = "embeddings"
    hf_prefixes = ("backbone.",)

    def __init__(self, config: dict, dtype: torch.dtype, tp: TensorParallel = TensorParallel()):
        """tp: always one rank (supports_tensor_parallel is False; the loader says so)."""
        super().__init__()
        if config.get("hidden_act", "silu") != "silu":
            raise ValueError(f"Mamba hidden_act {config['hidden_act']!r} unsupported (silu only)")
        self.config, self.dtype = config, dtype
        hidden = config["hidden_size"]
        self.residual_in_fp32 = config.get("residual_in_fp32", True)
        self.embeddings = Embedding(config["vocab_size"], hidden, dtype)
        self.layers = nn.ModuleList(MambaBlock(config, dtype) for _ in range(config["num_hidden_layers"]))
        self.norm_f = RMSNorm(hidden, config.get("layer_norm_epsilon", 1e-5), dtype)
        self.tie_word_embeddings = config.get("tie_word_embeddings", True)
        if not self.tie_word_embeddings:
            self.lm_head = Linear(hidden, config["vocab_size"], False, dtype)

    def cache_spec(self) -> CacheSpec:
        mixer = self.layers[0].mixer
        return CacheSpec(
            num_attention_layers=0, num_kv_heads=0, head_dim=0,
            num_state_layers=len(self.layers),
            conv_state_shape=(mixer.d_inner, mixer.d_conv),
            ssm_state_shape=(mixer.d_inner, mixer.d_state),
            state_dtype=STATE_DTYPE,
        )

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Packed tokens -> hidden [T, hidden]; updates the state rows of the forward context's
        state layout (positions are unused: the recurrence carries order)."""
        context = get_forward_context()
        residual = self.embeddings(input_ids)  # [T, hidden]
        if self.residual_in_fp32:
            residual = residual.float()
        for i, layer in enumerate(self.layers):
            residual = layer(residual, context.state_layout, context.caches.conv[i],
                             context.caches.ssm[i], self.dtype)
        return self.norm_f(residual.to(self.dtype))

    def hf_name(self, name: str) -> str:
        return name.replace("embedding.", "embeddings.")
