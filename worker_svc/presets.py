"""Built-in model presets: Hugging Face style config.json dicts, random weights, byte tokenizer.

They let every test, benchmark and demo run with no download. `tiny-llama` is the shape the
peer figures in DESIGN.md were measured on; `opt-125m` is facebook/opt-125m's shape; `tiny-qwen3`
is tiny-llama's size with Qwen3's traits (q/k norms, grouped-query attention, a head_dim of 128
that is not hidden / heads, tied embeddings); `tiny-mixtral` is tiny-llama with a mixture of experts;
`qwen3-0.6b` and `llama-3.2-1b` are Qwen/Qwen3-0.6B's and meta-llama/Llama-3.2-1B's shapes (the
latter with its llama3 rope scaling and tied embeddings), the real-size models benchmarks name;
`all-minilm-l6-v2` and `bge-small` are the encoder embedders sentence-transformers/all-MiniLM-L6-v2
and BAAI/bge-small-en-v1.5 (their configs; PRESET_POOLING: their sentence-transformers pooling).
"""
from worker_svc.byte_tokenizer import LLAMA_SPECIALS, OPT_SPECIALS


def _llama(vocab_size, hidden_size, intermediate_size, num_layers, num_heads, num_kv_heads,
           max_positions) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": vocab_size, "hidden_size": hidden_size,
        "intermediate_size": intermediate_size, "num_hidden_layers": num_layers,
        "num_attention_heads": num_heads, "num_key_value_heads": num_kv_heads,
        "max_position_embeddings": max_positions, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
        "hidden_act": "silu", "tie_word_embeddings": False, "attention_bias": False,
        "bos_token_id": LLAMA_SPECIALS["<s>"], "eos_token_id": LLAMA_SPECIALS["</s>"],
        "pad_token_id": LLAMA_SPECIALS["<pad>"], "torch_dtype": "float32",
    }


def _qwen3(vocab_size, hidden_size, intermediate_size, num_layers, num_heads, num_kv_heads, head_dim,
           max_positions) -> dict:
    return {
        **_llama(vocab_size, hidden_size, intermediate_size, num_layers, num_heads, num_kv_heads, max_positions),
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "head_dim": head_dim,
        "rope_theta": 1_000_000.0, "tie_word_embeddings": True,
    }


def _llama3_2(vocab_size, hidden_size, intermediate_size, num_layers, num_heads, num_kv_heads,
              max_positions) -> dict:
    return {**_llama(vocab_size, hidden_size, intermediate_size, num_layers, num_heads, num_kv_heads, max_positions),
            "rms_norm_eps": 1e-5, "rope_theta": 500_000.0, "tie_word_embeddings": True,
            "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}


def _mixtral(vocab_size, hidden_size, intermediate_size, num_layers, num_heads, num_kv_heads,
             num_experts, top_k, max_positions) -> dict:
    return {**_llama(vocab_size, hidden_size, intermediate_size, num_layers, num_heads, num_kv_heads,
                     max_positions),
            "architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
            "num_local_experts": num_experts, "num_experts_per_tok": top_k, "rope_theta": 1_000_000.0}


def _opt(vocab_size, hidden_size, ffn_dim, num_layers, num_heads, max_positions) -> dict:
    return {
        "architectures": ["OPTForCausalLM"], "model_type": "opt",
        "vocab_size": vocab_size, "hidden_size": hidden_size, "ffn_dim": ffn_dim,
        "num_hidden_layers": num_layers, "num_attention_heads": num_heads,
        "max_position_embeddings": max_positions, "word_embed_proj_dim": hidden_size,
        "do_layer_norm_before": True, "activation_function": "relu", "enable_bias": True,
        "layer_norm_elementwise_affine": True, "tie_word_embeddings": True,
        "bos_token_id": OPT_SPECIALS["</s>"], "eos_token_id": OPT_SPECIALS["</s>"],
        "pad_token_id": OPT_SPECIALS["<pad>"], "torch_dtype": "float32",
    }


def _bert(vocab_size, hidden_size, intermediate_size, num_layers, num_heads, max_positions) -> dict:
    return {
        "architectures": ["BertModel"], "model_type": "bert", "vocab_size": vocab_size,
        "hidden_size": hidden_size, "intermediate_size": intermediate_size, "num_hidden_layers": num_layers,
        "num_attention_heads": num_heads, "max_position_embeddings": max_positions, "type_vocab_size": 2,
        "hidden_act": "gelu", "layer_norm_eps": 1e-12, "pad_token_id": 0, "torch_dtype": "float32",
    }


PRESETS: dict[str, dict] = {
    "tiny-llama": _llama(32000, 256, 688, 4, 4, 4, 2048),
    "micro-llama": _llama(1000, 128, 256, 2, 2, 2, 512),
    "tiny-qwen3": _qwen3(32000, 256, 688, 4, 4, 2, 128, 2048),
    "qwen3-0.6b": _qwen3(151936, 1024, 3072, 28, 16, 8, 128, 40960),
    "llama-3.2-1b": _llama3_2(128256, 2048, 8192, 16, 32, 8, 131072),
    # tiny-llama's shape with 8 experts of its MLP per layer, 2 per token (Mixtral's ratio),
    # and grouped-query attention (4 heads over 2 KV heads).
    "tiny-mixtral": _mixtral(32000, 256, 688, 4, 4, 2, 8, 2, 2048),
    "tiny-opt": _opt(1000, 128, 512, 2, 4, 512),
    "opt-125m": _opt(50272, 768, 3072, 12, 12, 2048),
    "tiny-mamba": {
        "architectures": ["MambaForCausalLM"], "model_type": "mamba", "vocab_size": 1000,
        "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 4, "state_size": 16,
        "conv_kernel": 4, "expand": 2, "time_step_rank": 8, "use_conv_bias": True,
        "use_bias": False, "layer_norm_epsilon": 1e-5, "residual_in_fp32": True,
        "hidden_act": "silu", "tie_word_embeddings": True, "max_position_embeddings": 2048,
        "bos_token_id": LLAMA_SPECIALS["<s>"], "eos_token_id": LLAMA_SPECIALS["</s>"],
        "pad_token_id": LLAMA_SPECIALS["<pad>"], "torch_dtype": "float32",
    },
    # Layers: mamba, mamba+MoE, attention, mamba+MoE (Jamba's 1:7 attention ratio, shrunk).
    "tiny-jamba": {
        "architectures": ["JambaForCausalLM"], "model_type": "jamba", "vocab_size": 1000,
        "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 4,
        "num_attention_heads": 4, "num_key_value_heads": 2, "attn_layer_period": 4,
        "attn_layer_offset": 2, "expert_layer_period": 2, "expert_layer_offset": 1,
        "num_experts": 4, "num_experts_per_tok": 2, "mamba_d_state": 16, "mamba_d_conv": 4,
        "mamba_expand": 2, "mamba_dt_rank": 8, "mamba_conv_bias": True,
        "mamba_proj_bias": False, "rms_norm_eps": 1e-6, "hidden_act": "silu",
        "tie_word_embeddings": False, "max_position_embeddings": 2048,
        "bos_token_id": LLAMA_SPECIALS["<s>"], "eos_token_id": LLAMA_SPECIALS["</s>"],
        "pad_token_id": LLAMA_SPECIALS["<pad>"], "torch_dtype": "float32",
    },
    "all-minilm-l6-v2": _bert(30522, 384, 1536, 6, 12, 512),
    "bge-small": _bert(30522, 384, 1536, 12, 12, 512),
}
# The encoder presets' sentence-transformers pooling: (pooling type, normalize)
PRESET_POOLING = {"all-minilm-l6-v2": ("MEAN", True), "bge-small": ("CLS", True)}


def preset_specials(config: dict) -> dict[str, int]:
    return OPT_SPECIALS if config["model_type"] == "opt" else LLAMA_SPECIALS


def preset_pooling(name: str) -> tuple[str, bool] | None:
    return PRESET_POOLING.get(name)


def is_preset(name: str) -> bool:
    return name in PRESETS


def preset_config(name: str) -> dict:
    return dict(PRESETS[name])
