"""A model's config (a preset's, or a Hugging Face folder's config.json), read without torch.

The worker reads it before its heavy imports, so that a model it cannot serve (an unknown
architecture, a missing folder) fails in a second with the reason, not after torch has loaded
(tens of seconds on a busy machine).
"""
import json
import os

from worker_svc import presets
from worker_svc.models import supported_architecture
from worker_svc.pooling_config import pooling_info, resolve_task


def read_config(model: str) -> dict:
    """model: a preset name (presets.PRESETS) or a Hugging Face model folder (a hub id's:
    model_source.resolve_model)."""
    if presets.is_preset(model):
        return presets.preset_config(model)
    if os.path.isdir(model):
        with open(os.path.join(model, "config.json")) as f:
            return json.load(f)
    raise ValueError(f"{model!r} is neither a preset ({sorted(presets.PRESETS)}), a folder, nor a Hugging Face "
                     "hub id (ORG/NAME)")


def check_servable(model: str, task: str = "auto", pooling_type: str | None = None,
                   normalize: bool | None = None) -> None:
    """Raises ValueError, with the reason, for a model no model class serves, or not for this
    task (pooling_config.py)."""
    config = read_config(model)
    supported_architecture(config)
    pooling_info(resolve_task(task, model, config), model, config, pooling_type, normalize)
