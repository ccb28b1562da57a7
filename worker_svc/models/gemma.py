"""Gemma 2 and Gemma 3 text (`Gemma2ForCausalLM`, `Gemma3ForCausalLM` of model_type gemma3_text),
built from the shared layers with Gemma's options.

What differs from Llama, each an option of a shared layer:
- embeddings scaled by sqrt(hidden_size), in the model's dtype (Embedding's scale);
- every RMSNorm multiplies by (1 + w) in float32 (RMSNorm's unit_offset), and a layer has four:
  x + post_attention_norm(attn(input_norm(x))), then x + post_ff_norm(mlp(pre_ff_norm(x)));
- GeGLU feed-forward (GatedMLP with hidden_activation gelu_pytorch_tanh);
- scores scaled by query_pre_attn_scalar ** -0.5, not head_dim ** -0.5;
- sliding-window layers interleaved with global ones (layer_types.py), Gemma 3's local layers
  with a rotary base of their own (rope_parameters["sliding_attention"], or the older
  rope_local_base_freq);
- Gemma 2: attention-logit soft-capping (attn_logit_softcapping) and final-logit soft-capping
  (final_logit_softcapping, CausalLM.compute_logits); Gemma 3: per-head q_norm / k_norm.

Tensor parallel as Llama (llama.py): heads and intermediate features split, norms replicated.
"""
import torch
from torch import nn

from worker_svc.models.base import CausalLM
from worker_svc.models.gated_mlp import GatedMLP
from worker_svc.models.layer_types import SLIDING, sliding_windows
from worker_svc.models.layers import Embedding, Linear, RMSNorm
from worker_svc.models.rotary import RotaryEmbedding, max_model_len, rope_parameters
from worker_svc.models.self_attention import SelfAttention
from worker_svc.parallel import TensorParallel

# sliding_window_pattern where a folder predates layer_types
_DEFAULT_PATTERN = {"gemma2": 2, "gemma3_text": 6}


def _rope(config: dict, layer_type: str) -> dict:
    """The rotary parameters of one layer type (rotary.rope_parameters): transformers 5 keys
    Gemma 3's by layer type; older Gemma 3 folders give the local layers rope_local_base_freq
    (default rope, no scaling); Gemma 2 shares one for both."""
    nested = layer_type in (config.get("rope_parameters") or {})
    if layer_type == SLIDING and not nested and "rope_local_base_freq" in config:
        return {"rope_type": "default", "rope_theta": config["rope_local_base_freq"]}
    return rope_parameters(config, layer_type)


class GemmaDecoderLayer(nn.Module):
    def __init__(self, config: dict, dtype: torch.dtype, tp: TensorParallel, layer_index: int,
                 sliding_window: int | None):
        super().__init__()
        hidden_size, num_heads = config["hidden_size"], config["num_attention_heads"]
        eps = config.get("rms_norm_eps", 1e-6)

        def norm() -> RMSNorm:
            return RMSNorm(hidden_size, eps, dtype, unit_offset=True)

        head_dim = config.get("head_dim") or hidden_size // num_heads
        self.input_layernorm, self.post_attention_layernorm = norm(), norm()
        self.pre_feedforward_layernorm, self.post_feedforward_layernorm = norm(), norm()
        bias = bool(config.get("attention_bias", False))
        self.self_attn = SelfAttention(
            hidden_size, num_heads, config.get("num_key_value_heads") or num_heads, head_dim, dtype, tp,
            layer_index, qkv_bias=bias, out_bias=bias,
            qk_norm_eps=eps if config.get("model_type") == "gemma3_text" else None, qk_norm_unit_offset=True,
            scale=config.get("query_pre_attn_scalar", head_dim) ** -0.5, sliding_window=sliding_window,
            softcap=config.get("attn_logit_softcapping"))
        self.mlp = GatedMLP(hidden_size, config["intermediate_size"], False, dtype, tp,
                            activation=config.get("hidden_activation") or "gelu_pytorch_tanh")

    def forward(self, h, rotary, positions) -> torch.Tensor:
        h = h + self.post_attention_layernorm(self.self_attn(self.input_layernorm(h), rotary, positions))
        return h + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(h)))


class GemmaForCausalLM(CausalLM):
    supports_tensor_parallel = True
    supports_compile = True
    hf_skip = ("rotary_emb.",)

    def __init__(self, config: dict, dtype: torch.dtype, tp: TensorParallel = TensorParallel()):
        super().__init__()
        self.config = config
        hidden_size = config["hidden_size"]
        windows = sliding_windows(config, _DEFAULT_PATTERN.get(config.get("model_type"), 2))
        self.embed_tokens = Embedding(config["vocab_size"], hidden_size, dtype, scale=hidden_size ** 0.5)
        self.layers = nn.ModuleList(GemmaDecoderLayer(config, dtype, tp, i, window)
                                    for i, window in enumerate(windows))
        self.norm = RMSNorm(hidden_size, config.get("rms_norm_eps", 1e-6), dtype, unit_offset=True)
        self.tie_word_embeddings = bool(config.get("tie_word_embeddings", True))
        if not self.tie_word_embeddings:
            self.lm_head = Linear(hidden_size, config["vocab_size"], False, dtype)
        self.final_logit_softcapping = config.get("final_logit_softcapping")
        head_dim = self.layers[0].self_attn.head_dim
        ropes = {kind: _rope(config, kind) for kind in ("full_attention", SLIDING)}

        def rotary(rope: dict) -> RotaryEmbedding:
            return RotaryEmbedding(rope, head_dim, max_model_len(config), dtype,
                                   config_max_position_embeddings=config.get("max_position_embeddings"))

        self.rotary = rotary(ropes["full_attention"])
        self.local_rotary = self.rotary if ropes[SLIDING] == ropes["full_attention"] else rotary(ropes[SLIDING])

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        h = self.embed_tokens(input_ids)  # [T, hidden]
        for layer in self.layers:
            rotary = self.rotary if layer.self_attn.sliding_window is None else self.local_rotary
            h = layer(h, rotary, positions)
        return self.norm(h)
