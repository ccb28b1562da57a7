"""The model's sampling defaults applied to a request's unset fields: the one place that does it.

A model folder's generation_config.json may choose its own temperature, top_p, top_k, min_p and
repetition_penalty; the worker relays them (ModelInfo.sampling_defaults, empty under
--generation-config vllm). As in vLLM, they fill what a request leaves unset: over HTTP the
fields a request omits (the gateway), in the SDK and LLM a request given no SamplingParams at
all (an explicit SamplingParams is taken as it is, vLLM's LLM too).
"""
from typing import Any

import msgspec

from protocol.client_messages import ModelInfo
from protocol.sampling import SamplingParams


def with_model_defaults(fields: dict[str, Any], info: ModelInfo | None) -> dict[str, Any]:
    """fields: the sampling fields a request set -> those plus the model's defaults for the rest."""
    if info is None:
        return fields
    defaults = msgspec.structs.asdict(info.sampling_defaults)
    return {**{name: value for name, value in defaults.items() if value is not None}, **fields}


def default_sampling_params(info: ModelInfo | None) -> SamplingParams:
    """What a request with no SamplingParams samples with (vLLM's LLM.get_default_sampling_params)."""
    return msgspec.convert(with_model_defaults({}, info), SamplingParams)
