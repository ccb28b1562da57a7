"""Model loading: a Hugging Face folder or a built-in preset, real or seeded random weights.

Random ("dummy") weights are a pure function of (parameter name, shape, seed): two processes
that load the same preset get bit-identical weights, which end-to-end tests rely on. Under
tensor parallelism each rank draws the full (unsharded) tensor and keeps its slice, so a group
of N ranks holds exactly the weights of one worker alone.
"""
import json
import os
import zlib
from dataclasses import dataclass, field

import msgspec
import torch

from protocol.sampling import SamplingDefaults
from worker_svc import presets
from worker_svc.byte_tokenizer import byte_tokenizer_json
from worker_svc.model_config import read_config
from worker_svc.model_source import weight_files
from worker_svc.models import model_class
from worker_svc.models.layers import shard_full
from worker_svc.parallel import TensorParallel

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
LOAD_FORMATS = ("auto", "safetensors", "pt", "dummy")
_DUMMY_STD = 0.02  # like Hugging Face's initializer_range


@dataclass
class LoadedModel:
    name: str
    config: dict
    model: torch.nn.Module
    dtype: torch.dtype
    device: torch.device
    tokenizer_json: str | None
    eos_token_ids: list[int]
    chat_template: str | None = None
    special_tokens: dict[str, str] = field(default_factory=dict)  # bos_token, eos_token, ...
    sampling_defaults: SamplingDefaults = field(default_factory=SamplingDefaults)

    @property
    def dtype_name(self) -> str:
        return str(self.dtype).removeprefix("torch.")


def load_model(model: str, *, dtype: str = "auto", device: str = "cpu",
               load_format: str = "auto", seed: int = 0,
               tp: TensorParallel = TensorParallel(), generation_config: str = "auto",
               name: str | None = None) -> LoadedModel:
    """model: a preset name (presets.PRESETS) or a Hugging Face model folder (a hub id's:
    model_source.resolve_model); tp: which shard of it this process holds; generation_config:
    where sampling defaults come from (runner_config.RunnerConfig.generation_config); name: what
    the model is called (default: model; the hub id, for its snapshot folder)."""
    if load_format not in LOAD_FORMATS:
        raise ValueError(f"load_format {load_format!r} not in {LOAD_FORMATS}")
    device = torch.device(device)
    chat_template, special_tokens = None, {}
    config = read_config(model)
    if presets.is_preset(model):
        tokenizer_json = byte_tokenizer_json(config["vocab_size"], presets.preset_specials(config))
        load_format = "dummy"  # presets have no weights but their seeded random ones
    else:
        tokenizer_json = _read_optional(os.path.join(model, "tokenizer.json"))
        chat_template, special_tokens = read_chat_template(model)
    cls = model_class(config)
    if tp.size > 1 and not getattr(cls, "supports_tensor_parallel", False):
        raise ValueError(f"{model}: {config.get('architectures')} does not support tensor "
                         "parallelism (state-space models: Mamba, Jamba); use "
                         "--tensor-parallel-size 1 and data-parallel replicas instead")
    torch_dtype = resolve_dtype(dtype, config, is_folder=not presets.is_preset(model), device=device)
    with torch.device(device):
        module = cls(config, torch_dtype, tp)
    if load_format == "dummy":
        init_dummy_weights(module, seed)
    else:
        module.load_weights(_iter_checkpoint(model, load_format))
    module.eval()
    folder = None if presets.is_preset(model) else model
    eos = _eos_token_ids(config, folder)
    defaults_folder = {"auto": folder, "vllm": None}.get(generation_config, generation_config)
    return LoadedModel(name or model, config, module, torch_dtype, device, tokenizer_json, eos, chat_template,
                       special_tokens, sampling_defaults(defaults_folder))


def read_chat_template(folder: str) -> tuple[str | None, dict[str, str]]:
    """The folder's chat template and the special tokens' text, where transformers finds them:
    chat_template.jinja first, else tokenizer_config.json's chat_template (a string, or a list
    of named templates of which "default" is used); the tokens from special_tokens_map.json
    and tokenizer_config.json."""
    config = json.loads(_read_optional(os.path.join(folder, "tokenizer_config.json")) or "{}")
    template = _read_optional(os.path.join(folder, "chat_template.jinja")) or config.get("chat_template")
    if isinstance(template, list):
        template = {t.get("name"): t.get("template") for t in template}.get("default")
    special_tokens = {}
    tokens_map = json.loads(_read_optional(os.path.join(folder, "special_tokens_map.json")) or "{}")
    for name, value in {**tokens_map, **config}.items():
        if name.endswith("_token") and isinstance(value, dict):
            value = value.get("content")  # an AddedToken as transformers saves it
        if name.endswith("_token") and isinstance(value, str):
            special_tokens[name] = value
    return template if isinstance(template, str) else None, special_tokens


def resolve_dtype(dtype: str, config: dict, is_folder: bool, device: torch.device) -> torch.dtype:
    if dtype != "auto":
        if dtype not in DTYPES:
            raise ValueError(f"dtype {dtype!r} not in {sorted(DTYPES)} or 'auto'")
        return DTYPES[dtype]
    if is_folder:
        name = config.get("torch_dtype") or config.get("dtype") or "float32"
        return DTYPES.get(name, torch.float32)
    # Presets: bfloat16 on GPUs and on CPUs with bf16 matmul units (AMX, AVX512-BF16). On a
    # CPU without them (AVX2 only) torch emulates bf16 and a matmul ran ~6x slower than in
    # float32 (measured: [256, 256] x [256, 32000] 270 ms vs 44 ms), so float32 there.
    if device.type == "cuda" or _cpu_has_fast_bf16():
        return torch.bfloat16
    return torch.float32


def _cpu_has_fast_bf16() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            flags = set(f.read().split())
    except OSError:
        return False
    return bool(flags & {"amx_bf16", "avx512_bf16"})


@torch.no_grad()
def init_dummy_weights(module: torch.nn.Module, seed: int = 0) -> None:
    """Seeded normal(0, 0.02) weights and biases; norm weights 1 so activations stay sane."""
    modules = dict(module.named_modules())
    for name, param in module.named_parameters():
        if "norm" in name and name.endswith(".weight"):
            param.fill_(1.0)
            continue
        module_name, _, param_name = name.rpartition(".")
        owner = modules[module_name]
        shardable = hasattr(owner, "full_shape")  # a Linear or stacked experts
        shape = owner.full_shape(param_name) if shardable else param.shape
        generator = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
        values = torch.randn(shape, generator=generator, dtype=torch.float32)
        if shardable:
            values = shard_full(owner, param_name, values)
        param.copy_(values.mul_(_DUMMY_STD))


def _iter_checkpoint(folder: str, load_format: str):
    """(name, tensor) of every weight file the checkpoint has: each shard, for a sharded one."""
    def read_index(index: str) -> dict:
        with open(os.path.join(folder, index)) as f:
            return json.load(f)
    files = weight_files(os.listdir(folder), load_format, read_index)
    if not files:
        raise FileNotFoundError(f"no {load_format} weights in {folder}")
    for path in (os.path.join(folder, name) for name in files):
        if path.endswith(".safetensors"):
            from safetensors import safe_open
            with safe_open(path, framework="pt") as f:
                for name in f.keys():
                    yield name, f.get_tensor(name)
        else:
            yield from torch.load(path, map_location="cpu", weights_only=True).items()


def _eos_token_ids(config: dict, folder: str | None) -> list[int]:
    """config.json's EOS ids and generation_config.json's extra ones (always: vLLM reads those
    whatever --generation-config says)."""
    ids = []
    for value in (config.get("eos_token_id"), _generation_config(folder).get("eos_token_id")):
        for token_id in [value] if isinstance(value, int) else value or []:
            if token_id not in ids:
                ids.append(token_id)
    return ids


# transformers' GenerationConfig defaults: a value equal to one is not the model's own choice
# (vLLM reads generation_config.json through to_diff_dict, which drops them).
_TRANSFORMERS_DEFAULTS = {"temperature": 1.0, "top_k": 50, "top_p": 1.0, "min_p": None, "repetition_penalty": 1.0}


def sampling_defaults(folder: str | None) -> SamplingDefaults:
    """The sampling defaults of a folder's generation_config.json (none without a folder)."""
    generation = _generation_config(folder)
    fields = {name: generation[name] for name, default in _TRANSFORMERS_DEFAULTS.items()
              if generation.get(name, default) != default}
    if generation.get("max_new_tokens") is not None:  # vLLM's get_diff_sampling_param renames it so
        fields["max_tokens"] = generation["max_new_tokens"]
    try:
        return msgspec.convert(fields, SamplingDefaults)
    except msgspec.ValidationError as e:
        raise ValueError(f"{folder}/generation_config.json: {e}") from None


def _generation_config(folder: str | None) -> dict:
    text = folder and _read_optional(os.path.join(folder, "generation_config.json"))
    return json.loads(text) if text else {}


def _read_optional(path: str) -> str | None:
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return f.read()
