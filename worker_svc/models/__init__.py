"""Model classes by the `architectures` name of a Hugging Face config.json, and the rotary
embedding types they may use: what the worker serves (`stepserve models` lists both). Imports
no torch, so a client-only install can list them."""
import importlib

ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn", "longrope")  # models/rotary.py

_ARCHITECTURES = {
    "LlamaForCausalLM": ("worker_svc.models.llama", "LlamaForCausalLM"),
    "MistralForCausalLM": ("worker_svc.models.llama", "LlamaForCausalLM"),
    "Qwen2ForCausalLM": ("worker_svc.models.llama", "LlamaForCausalLM"),
    "Qwen3ForCausalLM": ("worker_svc.models.llama", "LlamaForCausalLM"),
    "Gemma2ForCausalLM": ("worker_svc.models.gemma", "GemmaForCausalLM"),
    "Gemma3ForCausalLM": ("worker_svc.models.gemma", "GemmaForCausalLM"),
    "MixtralForCausalLM": ("worker_svc.models.mixtral", "MixtralForCausalLM"),
    "Qwen3MoeForCausalLM": ("worker_svc.models.mixtral", "Qwen3MoeForCausalLM"),
    "Phi3ForCausalLM": ("worker_svc.models.llama", "LlamaForCausalLM"),
    "OPTForCausalLM": ("worker_svc.models.opt", "OPTForCausalLM"),
    "MambaForCausalLM": ("worker_svc.models.mamba", "MambaForCausalLM"),
    "JambaForCausalLM": ("worker_svc.models.jamba", "JambaForCausalLM"),
    # Causal models without their head: embedders (--task embed) only
    "LlamaModel": ("worker_svc.models.llama", "LlamaModel"),
    "MistralModel": ("worker_svc.models.llama", "LlamaModel"),
    "Qwen2Model": ("worker_svc.models.llama", "LlamaModel"),
    "Qwen3Model": ("worker_svc.models.llama", "LlamaModel"),
    # Encoders (pooling models: embedders and cross-encoders)
    "BertModel": ("worker_svc.models.bert", "BertModel"),
    "RobertaModel": ("worker_svc.models.bert", "BertModel"),
    "XLMRobertaModel": ("worker_svc.models.bert", "BertModel"),
    "BertForSequenceClassification": ("worker_svc.models.bert", "BertForSequenceClassification"),
    "RobertaForSequenceClassification": ("worker_svc.models.bert", "BertForSequenceClassification"),
    "XLMRobertaForSequenceClassification": ("worker_svc.models.bert", "BertForSequenceClassification"),
}


def supported_architectures() -> list[str]:
    return sorted(_ARCHITECTURES)


def supported_architecture(config: dict) -> str:
    """The first of the config's architectures a model class serves (imports no torch)."""
    for arch in config.get("architectures") or []:
        if arch in _ARCHITECTURES:
            return arch
    raise ValueError(f"unsupported architectures {config.get('architectures')}; "
                     f"supported: {sorted(_ARCHITECTURES)}")


def model_class(config: dict):
    module, name = _ARCHITECTURES[supported_architecture(config)]
    return getattr(importlib.import_module(module), name)
