"""Real Hugging Face model folders with random weights, for tests that compare with transformers.

Each function builds a small model with transformers (seeded), saves it with save_pretrained in
float32 plus a byte-level tokenizer.json, and returns the path. Test-only: transformers is a
test dependency. Keyword overrides go to the transformers config.
"""
import os
import shutil

import torch

from worker_svc.byte_tokenizer import LLAMA_SPECIALS, OPT_SPECIALS, byte_tokenizer_json


def _save(model, path: str, specials: dict[str, int]) -> str:
    os.makedirs(path, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    with open(os.path.join(path, "tokenizer.json"), "w") as f:
        f.write(byte_tokenizer_json(model.config.vocab_size, specials))
    return str(path)


def _llama_defaults(**overrides) -> dict:
    config = dict(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256,
                  rms_norm_eps=1e-6, bos_token_id=LLAMA_SPECIALS["<s>"],
                  eos_token_id=LLAMA_SPECIALS["</s>"], pad_token_id=LLAMA_SPECIALS["<pad>"],
                  tie_word_embeddings=False)
    config.update(overrides)
    return config


def make_llama_folder(path: str, seed: int = 0, **overrides) -> str:
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**_llama_defaults(**overrides))).float().eval()
    return _save(model, path, LLAMA_SPECIALS)


def make_qwen2_folder(path: str, seed: int = 0, **overrides) -> str:
    """Qwen2: q/k/v bias, grouped-query attention (4 heads over 2 KV heads), tied embeddings."""
    from transformers import Qwen2Config, Qwen2ForCausalLM
    torch.manual_seed(seed)
    config = _llama_defaults(num_key_value_heads=2, rope_theta=1_000_000.0,
                             tie_word_embeddings=True)
    config.update(overrides)
    model = Qwen2ForCausalLM(Qwen2Config(**config)).float().eval()
    with torch.no_grad():  # HF initialises biases to 0; make them matter
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_(0, 0.02)
    return _save(model, path, LLAMA_SPECIALS)


def make_qwen3_folder(path: str, seed: int = 0, **overrides) -> str:
    """Qwen3: per-head q/k RMSNorm, head_dim (32) not hidden / heads (16), grouped-query attention
    (4 heads over 2 KV heads). Weights of std 0.1 (not 0.02) and an untied head, so that greedy
    outputs vary from token to token rather than repeat the last one."""
    from transformers import Qwen3Config, Qwen3ForCausalLM
    torch.manual_seed(seed)
    config = _llama_defaults(num_key_value_heads=2, head_dim=32, rope_theta=1_000_000.0,
                             initializer_range=0.1)
    config.update(overrides)
    model = Qwen3ForCausalLM(Qwen3Config(**config)).float().eval()
    with torch.no_grad():  # HF initialises norm weights to 1; make q_norm / k_norm matter
        for layer in model.model.layers:
            for norm in (layer.self_attn.q_norm, layer.self_attn.k_norm):
                norm.weight.normal_(1, 0.2)
    return _save(model, path, LLAMA_SPECIALS)


def make_mistral_folder(path: str, seed: int = 0, **overrides) -> str:
    """Mistral with an 8-token sliding window (shorter than the tests' prompts plus outputs)
    and grouped-query attention (4 heads over 2 KV heads)."""
    from transformers import MistralConfig, MistralForCausalLM
    torch.manual_seed(seed)
    config = _llama_defaults(num_key_value_heads=2, sliding_window=8)
    config.update(overrides)
    model = MistralForCausalLM(MistralConfig(**config)).float().eval()
    _sharpen_attention(model)
    return _save(model, path, LLAMA_SPECIALS)


def _gemma_defaults() -> dict:
    """Gemma's options all in play: grouped-query attention, head_dim (32) not hidden / heads,
    query_pre_attn_scalar (24) not head_dim, an 8-token window on the first layer, a global
    second layer."""
    return _llama_defaults(num_key_value_heads=2, head_dim=32, query_pre_attn_scalar=24, sliding_window=8,
                           layer_types=["sliding_attention", "full_attention"], tie_word_embeddings=True)


def make_gemma2_folder(path: str, seed: int = 0, **overrides) -> str:
    """Gemma 2, its soft-caps low enough to change scores (attention) and logprobs (final)."""
    from transformers import Gemma2Config, Gemma2ForCausalLM
    return _make_gemma_folder(path, Gemma2ForCausalLM, Gemma2Config, seed,
                              dict(attn_logit_softcapping=2.0, final_logit_softcapping=0.5, **overrides))


def make_gemma3_folder(path: str, seed: int = 0, **overrides) -> str:
    """Gemma 3 text (model_type gemma3_text): q_norm / k_norm, and its local layers' own rotary
    base (rope_local_base_freq, far from the global one)."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig
    return _make_gemma_folder(path, Gemma3ForCausalLM, Gemma3TextConfig, seed,
                              dict(rope_theta=1_000_000.0, rope_local_base_freq=100.0, **overrides))


def _make_gemma_folder(path: str, model_class, config_class, seed: int, overrides: dict) -> str:
    torch.manual_seed(seed)
    config = _gemma_defaults()
    config.update(overrides)
    model = model_class(config_class(**config)).float().eval()
    with torch.no_grad():  # HF initialises Gemma's (1 + w) norm weights to 0; make each w matter
        for name, param in model.named_parameters():
            if "norm" in name:
                param.normal_(0, 0.3)
    _sharpen_attention(model)
    return _save(model, path, LLAMA_SPECIALS)


def _sharpen_attention(model) -> None:
    """Scale q and k up so that scores are O(1), not ~0: with near-uniform attention a window,
    a soft-cap or a wrong position would barely change the tokens."""
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(6)
            layer.self_attn.k_proj.weight.mul_(6)


def without_sliding_window(folder: str, path: str) -> str:
    """A copy of a saved folder whose config has no window in effect (a window longer than any
    test sequence), to show that the window changes the tokens."""
    import json
    import shutil
    shutil.copytree(folder, path)
    with open(os.path.join(path, "config.json")) as f:
        config = json.load(f)
    config["sliding_window"] = 1 << 16
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)
    return str(path)


def make_phi3_folder(path: str, seed: int = 0, **overrides) -> str:
    """Phi-3: fused qkv_proj and gate_up_proj on disk, grouped-query attention (4 heads over 2 KV
    heads), partial rotary (half of head_dim 16) with longrope switching from the short to the
    long factors past 16 tokens, and a 12-token sliding window: both inside the tests' lengths."""
    from transformers import Phi3Config, Phi3ForCausalLM
    torch.manual_seed(seed)
    config = _llama_defaults(num_key_value_heads=2, max_position_embeddings=64,
                             original_max_position_embeddings=16, partial_rotary_factor=0.5,
                             sliding_window=12, initializer_range=0.1,
                             rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                                              "short_factor": [1.0, 1.2, 1.5, 2.0],
                                              "long_factor": [3.0, 5.0, 9.0, 17.0]})
    config.update(overrides)
    model = Phi3ForCausalLM(Phi3Config(**config)).float().eval()
    return _save(model, path, LLAMA_SPECIALS)


def make_opt_folder(path: str, seed: int = 0, **overrides) -> str:
    from transformers import OPTConfig, OPTForCausalLM
    torch.manual_seed(seed)
    config = dict(vocab_size=1000, hidden_size=64, ffn_dim=128, num_hidden_layers=2,
                  num_attention_heads=4, max_position_embeddings=256, word_embed_proj_dim=64,
                  do_layer_norm_before=True, bos_token_id=OPT_SPECIALS["</s>"],
                  eos_token_id=OPT_SPECIALS["</s>"], pad_token_id=OPT_SPECIALS["<pad>"])
    config.update(overrides)
    model = OPTForCausalLM(OPTConfig(**config)).float().eval()
    with torch.no_grad():  # HF initialises biases to 0; make them matter
        for name, param in model.named_parameters():
            if name.endswith(".bias") and "layer_norm" not in name:
                param.normal_(0, 0.02)
    return _save(model, path, OPT_SPECIALS)


def _spread_routers(model, std: float = 0.5) -> None:
    """HF draws router weights like every weight (std 0.02): every expert then gets nearly the
    same probability and the top k is decided by noise. Wider routers make routing, and
    renormalising or not, change the outputs."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("mlp.gate.weight") and param.dim() == 2 and param.shape[0] < param.shape[1]:
                param.normal_(0, std)


def make_mixtral_folder(path: str, seed: int = 0, **overrides) -> str:
    """Mixtral: every layer a mixture of 4 experts, top 2 (renormalised), 4 heads over 2 KV heads."""
    from transformers import MixtralConfig, MixtralForCausalLM
    torch.manual_seed(seed)
    config = _llama_defaults(num_key_value_heads=2, intermediate_size=96, num_local_experts=4,
                             num_experts_per_tok=2, rope_theta=1_000_000.0,
                             initializer_range=0.1)
    config.update(overrides)
    model = MixtralForCausalLM(MixtralConfig(**config)).float().eval()
    _spread_routers(model)
    return _save(model, path, LLAMA_SPECIALS)


def make_qwen3_moe_folder(path: str, seed: int = 0, **overrides) -> str:
    """Qwen3-MoE: per-head q/k norm, head_dim 32, 4 heads over 2 KV heads; 3 layers: 0 and 2
    mixtures of 4 experts (top 2, not renormalised: norm_topk_prob False) of
    moe_intermediate_size 48, layer 1 a dense MLP (mlp_only_layers)."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
    torch.manual_seed(seed)
    config = _llama_defaults(num_key_value_heads=2, head_dim=32, num_hidden_layers=3, num_experts=4,
                             num_experts_per_tok=2, moe_intermediate_size=48, decoder_sparse_step=1,
                             mlp_only_layers=[1], norm_topk_prob=False)
    config.update(overrides)
    model = Qwen3MoeForCausalLM(Qwen3MoeConfig(**config)).float().eval()
    _spread_routers(model)
    with torch.no_grad():  # HF initialises norm weights to 1; make q_norm / k_norm matter
        for layer in model.model.layers:
            for norm in (layer.self_attn.q_norm, layer.self_attn.k_norm):
                norm.weight.normal_(1, 0.2)
    return _save(model, path, LLAMA_SPECIALS)


# Zephyr's template, written over several lines so that trim_blocks / lstrip_blocks matter.
CHAT_TEMPLATE = """{{ bos_token }}
{% for message in messages %}
    {% if message['role'] == 'system' %}
<|system|>
{{ message['content'] }}{{ eos_token }}
    {% elif message['role'] == 'user' %}
<|user|>
{{ message['content'] }}{{ eos_token }}
    {% elif message['role'] == 'assistant' %}
<|assistant|>
{% generation %}{{ message['content'] }}{% endgeneration %}{{ eos_token }}
    {% else %}
{{ raise_exception('roles are system, user and assistant') }}
    {% endif %}
{% endfor %}
{% if add_generation_prompt %}
<|assistant|>
{% endif %}"""


def write_chat_template(folder: str, template: str = CHAT_TEMPLATE) -> str:
    """A tokenizer_config.json as transformers saves one, with a chat template and the specials."""
    import json
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": template,
              "bos_token": "<s>", "eos_token": {"__type": "AddedToken", "content": "</s>", "lstrip": False, "rstrip": False, "normalized": False, "single_word": False, "special": True}, "unk_token": "<unk>",
              "pad_token": "<pad>", "model_max_length": 256}
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump(config, f)
    return folder


def resharded(folder: str, path: str, max_shard_size: str) -> str:
    """A copy of a folder whose weights transformers saves again in safetensors shards of at most
    max_shard_size, with their model.safetensors.index.json; its other files copied as they are."""
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    model.save_pretrained(path, max_shard_size=max_shard_size)
    for name in os.listdir(folder):
        if not name.endswith(".safetensors") and not os.path.exists(os.path.join(path, name)):
            shutil.copy(os.path.join(folder, name), path)
    return str(path)


# ---- pooling models (issue 34): encoders and embedders, with sentence-transformers' files ----

BERT_SPECIALS = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": 4}
ROBERTA_SPECIALS = OPT_SPECIALS  # <s> 0, <pad> 1, </s> 2, <unk> 3: XLM-R's pad_token_id is 1


def _save_with_tokenizer(model, path: str, specials: dict[str, int], single: str, pair: str,
                         token_names: dict[str, str]) -> str:
    """save_pretrained, and a byte-level tokenizer whose post-processor adds the model's special
    tokens as its real tokenizer does (single, pair: tokenizers' TemplateProcessing), with a
    tokenizer_config.json that transformers' AutoTokenizer (and so sentence-transformers) reads."""
    import json

    from tokenizers import processors
    from worker_svc.byte_tokenizer import build_byte_tokenizer
    os.makedirs(path, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer = build_byte_tokenizer(model.config.vocab_size, specials)
    used = {t for t in specials if t in single or t in pair}
    tokenizer.post_processor = processors.TemplateProcessing(
        single=single, pair=pair, special_tokens=[(t, specials[t]) for t in sorted(used)])
    with open(os.path.join(path, "tokenizer.json"), "w") as f:
        f.write(tokenizer.to_str())
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 128, **token_names}, f)
    return str(path)


def _bert_config(**overrides) -> dict:
    """all-MiniLM-L6-v2's structure (gelu, post-norm, 2 token types), shrunk."""
    config = dict(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, max_position_embeddings=128, type_vocab_size=2, pad_token_id=0)
    config.update(overrides)
    return config


def _xlm_roberta_config(**overrides) -> dict:
    """bge-m3's structure (positions from pad_token_id + 1, one token type), shrunk."""
    config = dict(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, max_position_embeddings=130, type_vocab_size=1, pad_token_id=1,
                  bos_token_id=0, eos_token_id=2)
    config.update(overrides)
    return config


def _spread(model, std: float = 0.1) -> None:
    """HF initialises biases to 0 and LayerNorms to (1, 0): make every parameter matter. A
    classifier head's weights (std 0.02) would leave its logits all but its biases: widened."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if any(head in name for head in ("classifier.", "pooler.")) and name.endswith("weight"):
                param.normal_(0, 0.5)
            elif name.endswith("bias"):
                param.normal_(0, std)
            elif "LayerNorm" in name:
                param.normal_(1, std)


def _save_bert(model, path: str) -> str:
    return _save_with_tokenizer(model, path, BERT_SPECIALS, "[CLS] $A [SEP]", "[CLS] $A [SEP] $B:1 [SEP]:1",
                                {"cls_token": "[CLS]", "sep_token": "[SEP]", "pad_token": "[PAD]",
                                 "unk_token": "[UNK]", "mask_token": "[MASK]"})


def _save_roberta(model, path: str) -> str:
    return _save_with_tokenizer(model, path, ROBERTA_SPECIALS, "<s> $A </s>", "<s> $A </s> </s> $B </s>",
                                {"bos_token": "<s>", "cls_token": "<s>", "eos_token": "</s>", "sep_token": "</s>",
                                 "pad_token": "<pad>", "unk_token": "<unk>"})


def add_sentence_transformers(path: str, pooling_mode: str, normalize: bool) -> str:
    """Makes a saved folder a sentence-transformers model, saved by sentence-transformers itself:
    modules.json, 1_Pooling/config.json (pooling_mode: cls, mean or lasttoken) and a Normalize
    module if normalize."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer
    transformer = Transformer(path)
    modules = [transformer, Pooling(transformer.get_embedding_dimension(), pooling_mode=pooling_mode)]
    if normalize:
        modules.append(Normalize())
    SentenceTransformer(modules=modules, device="cpu").save(path)
    return str(path)


def make_bert_folder(path: str, seed: int = 0, pooling_mode: str | None = "mean", normalize: bool = True,
                     **overrides) -> str:
    """BertModel as all-MiniLM-L6-v2 is (pooling_mode mean, normalised; bge-small: cls), with
    sentence-transformers' files; pooling_mode None: a bare transformers folder."""
    from transformers import BertConfig, BertModel
    torch.manual_seed(seed)
    model = BertModel(BertConfig(**_bert_config(**overrides))).float().eval()
    _spread(model)
    _save_bert(model, path)
    return add_sentence_transformers(path, pooling_mode, normalize) if pooling_mode else str(path)


def make_bert_classifier_folder(path: str, seed: int = 0, num_labels: int = 3, **overrides) -> str:
    """BertForSequenceClassification (a cross-encoder): pooler and classifier, labels named."""
    from transformers import BertConfig, BertForSequenceClassification
    torch.manual_seed(seed)
    config = _bert_config(num_labels=num_labels, id2label={i: f"label_{i}" for i in range(num_labels)},
                          label2id={f"label_{i}": i for i in range(num_labels)}, **overrides)
    model = BertForSequenceClassification(BertConfig(**config)).float().eval()
    _spread(model)
    return _save_bert(model, path)


def make_xlm_roberta_folder(path: str, seed: int = 0, pooling_mode: str | None = "cls", normalize: bool = True,
                            **overrides) -> str:
    """XLMRobertaModel as BAAI/bge-m3 is (cls, normalised), with sentence-transformers' files."""
    from transformers import XLMRobertaConfig, XLMRobertaModel
    torch.manual_seed(seed)
    model = XLMRobertaModel(XLMRobertaConfig(**_xlm_roberta_config(**overrides))).float().eval()
    _spread(model)
    _save_roberta(model, path)
    return add_sentence_transformers(path, pooling_mode, normalize) if pooling_mode else str(path)


def make_xlm_roberta_classifier_folder(path: str, seed: int = 0, num_labels: int = 1, **overrides) -> str:
    """XLMRobertaForSequenceClassification as a bge-reranker is: one label (its sigmoid is the
    relevance score)."""
    from transformers import XLMRobertaConfig, XLMRobertaForSequenceClassification
    torch.manual_seed(seed)
    model = XLMRobertaForSequenceClassification(
        XLMRobertaConfig(**_xlm_roberta_config(num_labels=num_labels, **overrides))).float().eval()
    _spread(model)
    return _save_roberta(model, path)


def make_qwen3_embedding_folder(path: str, seed: int = 0, **overrides) -> str:
    """Qwen3 as Qwen3-Embedding is: a causal model whose tokenizer appends its end token, pooled
    by sentence-transformers at the last token, normalised."""
    make_qwen3_folder(path, seed, tie_word_embeddings=True, **overrides)
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    _save_with_tokenizer(model, path, LLAMA_SPECIALS, "$A </s>", "$A </s> $B </s>",
                         {"eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>"})
    return add_sentence_transformers(path, "lasttoken", True)
