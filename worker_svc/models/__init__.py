"""Model classes by the `architectures` name of a Hugging Face config.json."""
import importlib

_ARCHITECTURES = {
    "LlamaForCausalLM": ("worker_svc.models.llama", "LlamaForCausalLM"),
    "MistralForCausalLM": ("worker_svc.models.llama", "LlamaForCausalLM"),
    "Qwen2ForCausalLM": ("worker_svc.models.llama", "LlamaForCausalLM"),
    "Qwen3ForCausalLM": ("worker_svc.models.llama", "LlamaForCausalLM"),
    "Gemma2ForCausalLM": ("worker_svc.models.gemma", "GemmaForCausalLM"),
    "Gemma3ForCausalLM": ("worker_svc.models.gemma", "GemmaForCausalLM"),
    "MixtralForCausalLM": ("worker_svc.models.mixtral", "MixtralForCausalLM"),
    "Qwen3MoeForCausalLM": ("worker_svc.models.mixtral", "Qwen3MoeForCausalLM"),
    "OPTForCausalLM": ("worker_svc.models.opt", "OPTForCausalLM"),
    "MambaForCausalLM": ("worker_svc.models.mamba", "MambaForCausalLM"),
    "JambaForCausalLM": ("worker_svc.models.jamba", "JambaForCausalLM"),
}


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
