"""What a worker serves: the task (--task) and, for a pooling model, its PoolingInfo.

Read from the model folder without torch (the worker checks it before its heavy imports):
- the task, for --task auto: an encoder embedder (BertModel, XLMRobertaModel, ...), a causal
  model saved without its head (Qwen3Model) or a sentence-transformers folder (modules.json) embeds, a ...ForSequenceClassification
  classifies, anything else generates. --task embed on a causal model pools its hidden states
  after the final norm (Qwen3-Embedding).
- the pooling, from sentence-transformers' files: modules.json names the modules; its Pooling
  module's config.json says the mode (the pooling_mode_* switches, or a newer release's
  pooling_mode), and a Normalize module means normalised embeddings. Without them, vLLM's
  defaults: an encoder pools its first token (CLS), a causal model its last token (LAST), both
  normalised; a classifier pools its first token. --pooling-type and --normalize override.
"""
import json
import os

from protocol.pooling import POOLING_TYPES, TASKS, PoolingInfo
from worker_svc import presets
from worker_svc.models import supported_architecture

ENCODER_EMBEDDERS = ("BertModel", "RobertaModel", "XLMRobertaModel")
HEADLESS_CAUSAL = ("LlamaModel", "MistralModel", "Qwen2Model", "Qwen3Model")  # saved without an LM head
ENCODER_CLASSIFIERS = ("BertForSequenceClassification", "RobertaForSequenceClassification",
                       "XLMRobertaForSequenceClassification")
# sentence-transformers' Pooling modes (both spellings) -> ours; the others are refused
_ST_MODES = {"pooling_mode_cls_token": "CLS", "pooling_mode_mean_tokens": "MEAN", "pooling_mode_lasttoken": "LAST",
             "cls": "CLS", "mean": "MEAN", "lasttoken": "LAST"}
_ST_UNSUPPORTED = ("pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens",
                   "pooling_mode_weightedmean_tokens")
_ST_PASSIVE = ("Transformer", "Pooling", "Normalize")  # modules whose effect we reproduce


def is_classifier(architecture: str) -> bool:
    return architecture.endswith("ForSequenceClassification")


def is_encoder(architecture: str) -> bool:
    return architecture in ENCODER_EMBEDDERS + ENCODER_CLASSIFIERS


def resolve_task(task: str, model: str, config: dict) -> str:
    """--task for the model (a preset name or a folder) -> generate, embed or classify;
    ValueError for a task the model cannot serve."""
    if task not in TASKS:
        raise ValueError(f"--task {task!r} not in {TASKS}")
    arch = supported_architecture(config)
    if task == "auto":
        if is_classifier(arch):
            return "classify"
        has_st = not presets.is_preset(model) and os.path.isfile(os.path.join(model, "modules.json"))
        embedder = arch in ENCODER_EMBEDDERS + HEADLESS_CAUSAL or has_st or presets.preset_pooling(model)
        return "embed" if embedder else "generate"
    if task == "generate" and (is_encoder(arch) or arch in HEADLESS_CAUSAL):
        raise ValueError(f"--task generate: {arch} has no LM head; it serves --task embed"
                         + (" or classify" if is_classifier(arch) else ""))
    if task == "classify" and not is_classifier(arch):
        raise ValueError(f"--task classify: {arch} has no classifier head (a ...ForSequenceClassification does)")
    return task


def pooling_info(task: str, model: str, config: dict, pooling_type: str | None = None,
                 normalize: bool | None = None) -> PoolingInfo | None:
    """What the pooling model is (None for a generative task): task from resolve_task;
    pooling_type, normalize: the overrides (None: the folder's, else the defaults)."""
    if task == "generate":
        return None
    if pooling_type is not None and pooling_type not in POOLING_TYPES:
        raise ValueError(f"--pooling-type {pooling_type!r} not in {POOLING_TYPES}")
    arch = supported_architecture(config)
    bidirectional = is_encoder(arch)
    folder_pooling = presets.preset_pooling(model) if presets.is_preset(model) else sentence_transformers_pooling(model)
    default_type, default_normalize = folder_pooling or ("CLS" if bidirectional else "LAST", True)
    labels = []
    if task == "classify":
        default_type, default_normalize = "CLS", False
        labels = classifier_labels(config)
    return PoolingInfo(task=task, size=len(labels) if labels else config["hidden_size"],
                       normalize=default_normalize if normalize is None else normalize, labels=labels,
                       pooling_type=pooling_type or default_type, bidirectional=bidirectional)


def classifier_labels(config: dict) -> list[str]:
    """id2label in id order (transformers' default names where the config has none)."""
    id2label = {int(i): str(label) for i, label in (config.get("id2label") or {}).items()}
    num = len(id2label) or config.get("num_labels", 2)
    return [id2label.get(i, f"LABEL_{i}") for i in range(num)]


def sentence_transformers_pooling(folder: str) -> tuple[str, bool] | None:
    """(pooling type, normalize) from a sentence-transformers folder; None: not one.
    ValueError for a module or a pooling mode whose effect we would not reproduce."""
    modules_path = os.path.join(folder, "modules.json")
    if not os.path.isfile(modules_path):
        return None
    with open(modules_path) as f:
        modules = json.load(f)
    pooling_type, normalize = None, False
    for module in modules:
        kind = module.get("type", "").rsplit(".", 1)[-1]
        if kind not in _ST_PASSIVE:
            raise ValueError(f"{folder}: sentence-transformers module {module.get('type')!r} is not supported "
                             f"(only {', '.join(_ST_PASSIVE)})")
        if kind == "Normalize":
            normalize = True
        elif kind == "Pooling":
            with open(os.path.join(folder, module.get("path", ""), "config.json")) as f:
                pooling_type = _pooling_mode(json.load(f), folder)
    return pooling_type or "MEAN", normalize  # a Pooling module's default mode is mean


def _pooling_mode(config: dict, folder: str) -> str:
    if "pooling_mode" in config:  # sentence-transformers 6: one mode by name
        mode = config["pooling_mode"]
        if mode not in _ST_MODES:
            raise ValueError(f"{folder}: sentence-transformers pooling_mode {mode!r} is not supported "
                             "(cls, mean, lasttoken)")
        return _ST_MODES[mode]
    chosen = [key for key, on in config.items() if on is True and key.startswith("pooling_mode")]
    if len(chosen) != 1 or chosen[0] in _ST_UNSUPPORTED:
        raise ValueError(f"{folder}: sentence-transformers pooling {chosen} is not supported "
                         "(one of cls_token, mean_tokens, lasttoken)")
    return _ST_MODES[chosen[0]]
