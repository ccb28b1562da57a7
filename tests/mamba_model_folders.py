"""Test tool: tiny Mamba / Jamba model folders written by transformers itself (save_pretrained).

The folders hold random weights in Hugging Face names and layout, so a test can load the same
weights into transformers (the reference) and into stepserve (the system under test). Every
1-D parameter (norm weights, biases, D) is perturbed away from its 0/1 init: with the default
init a swapped b/c norm or a dropped conv bias would compute the same numbers and hide a bug.
"""
import os

import torch

MAMBA_CONFIG = dict(
    vocab_size=1000, hidden_size=64, state_size=16, num_hidden_layers=3, conv_kernel=4,
    expand=2, use_conv_bias=True, use_bias=False, layer_norm_epsilon=1e-5,
    pad_token_id=0, bos_token_id=0, eos_token_id=0, tie_word_embeddings=True,
)

# Layers: 0 mamba+MoE, 1 attention+MLP, 2 mamba+MoE, 3 attention+MLP (period 2, offsets 1 / 0).
JAMBA_CONFIG = dict(
    vocab_size=1000, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
    num_attention_heads=4, num_key_value_heads=2, attn_layer_period=2, attn_layer_offset=1,
    expert_layer_period=2, expert_layer_offset=0, num_experts=4, num_experts_per_tok=2,
    mamba_d_state=8, mamba_d_conv=4, mamba_expand=2, mamba_dt_rank="auto",
    mamba_conv_bias=True, mamba_proj_bias=False, rms_norm_eps=1e-6, initializer_range=0.1,
    tie_word_embeddings=False,
    pad_token_id=0, bos_token_id=1, eos_token_id=2,
)


def _perturb_vectors(model: torch.nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, param in sorted(model.named_parameters()):
            if param.dim() == 1:
                param.add_(0.1 * torch.randn(param.shape, generator=gen))


def _build(model_cls, config, seed: int):
    torch.manual_seed(seed)
    model = model_cls(config).to(torch.float32).eval()
    _perturb_vectors(model, seed + 1)
    return model


def make_mamba_folder(path: str, seed: int = 0, **overrides):
    """Write a tiny MambaForCausalLM to `path`; returns the transformers model (float32, eval)."""
    from transformers import MambaConfig, MambaForCausalLM

    model = _build(MambaForCausalLM, MambaConfig(**{**MAMBA_CONFIG, **overrides}), seed)
    os.makedirs(path, exist_ok=True)
    model.save_pretrained(path)
    return model


def make_jamba_folder(path: str, seed: int = 0, **overrides):
    """Write a tiny JambaForCausalLM to `path`; returns the transformers model (float32, eval)."""
    from transformers import JambaConfig, JambaForCausalLM

    config = JambaConfig(**{**JAMBA_CONFIG, **overrides})
    config._attn_implementation = "eager"
    model = _build(JambaForCausalLM, config, seed)
    os.makedirs(path, exist_ok=True)
    model.save_pretrained(path)
    return model
