"""Request bodies of OpenAI's API (with vLLM's extras), decoded and validated with msgspec, and
their sampling fields turned into the SDK's SamplingParams (which owns the value ranges).

Unknown fields are ignored, as vLLM does; fields we cannot honour (suffix, a streamed echo) are
refused with a 400 rather than silently dropped.
"""
from typing import TYPE_CHECKING, Any

import msgspec

from client_sdk.model_defaults import with_model_defaults
from gateway_svc.errors import bad_request
from gateway_svc.pooling_requests import require_task
from protocol.client_messages import ModelInfo
from protocol.sampling import SamplingParams

if TYPE_CHECKING:
    from gateway_svc.upstream import Upstream


class StreamOptions(msgspec.Struct, kw_only=True):
    include_usage: bool = False


class _SamplingFields(msgspec.Struct, kw_only=True):
    model: str | None = None
    n: int = 1
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    # vLLM's extras
    top_k: int | None = None
    min_p: float | None = None
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    return_token_ids: bool = False
    priority: int = 0
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None  # OpenAI's: token id (as a JSON key) -> bias
    repetition_penalty: float | None = None  # vLLM's extras
    bad_words: list[str] | None = None
    allowed_token_ids: list[int] | None = None
    # OpenAI's {"type": "json_object"} / {"type": "json_schema", "json_schema": {"schema": ...}},
    # or vLLM's structured_outputs ({"json": ...} | {"regex": ...} | {"choice": [...]} | ...).
    response_format: dict[str, Any] | None = None
    structured_outputs: dict[str, Any] | None = None


class CompletionRequest(_SamplingFields, kw_only=True):
    prompt: str | list[Any]
    # Unset: the model's own default (generation_config's max_new_tokens), else OpenAI's 16;
    # null: up to the model's length (vLLM's reading)
    max_tokens: int | None | msgspec.UnsetType = msgspec.UNSET
    logprobs: int | None = None
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None


class ChatCompletionRequest(_SamplingFields, kw_only=True):
    messages: list[dict[str, Any]]
    max_tokens: int | None = None  # None: up to the model's length
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[Any] | None = None
    tool_choice: str | dict[str, Any] | None = None  # unset: "auto" with tools, else "none" (tool_choice.py)
    parallel_tool_calls: bool | None = None
    add_generation_prompt: bool = True
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None


def decode_body(body: bytes, kind: type):
    try:
        return msgspec.json.decode(body, type=kind)
    except msgspec.ValidationError as e:
        raise bad_request(f"invalid request: {e}") from None
    except msgspec.DecodeError as e:
        raise bad_request(f"the body is not valid JSON: {e}") from None
    except RecursionError:
        raise bad_request("the body nests lists and objects too deeply to parse") from None


async def checked_request(body: bytes, kind: type, upstream: "Upstream", endpoint: str,
                          tasks: tuple[str, ...] = ("generate",)) -> tuple[Any, ModelInfo]:
    """The body decoded as `kind`, naming a model this gateway serves that does one of `tasks`
    (pooling_requests.require_task), with the fields stepserve cannot honour refused: the head
    every endpoint and batch line shares."""
    req = decode_body(body, kind)
    info = await upstream.check_model(req.model)
    require_task(info, upstream.name_of(info), endpoint, tasks)
    refuse_unsupported(req)
    return req, info


def refuse_unsupported(req) -> None:
    if isinstance(req, CompletionRequest):
        if req.echo and req.stream:
            raise bad_request("echo is not supported with stream", param="echo")
        if req.max_tokens == 0 and not req.echo:
            raise bad_request("max_tokens 0 scores the prompt: it needs echo", param="max_tokens")
        if req.suffix:
            raise bad_request("suffix is not supported", param="suffix")
        if req.best_of not in (None, req.n):
            raise bad_request("best_of other than n is not supported", param="best_of")


def _token_keys(logit_bias: dict[str, float]) -> dict[int, float]:
    try:
        return {int(token): bias for token, bias in logit_bias.items()}
    except ValueError:
        raise bad_request("logit_bias keys must be token ids", param="logit_bias") from None


def structured_outputs(req: _SamplingFields, forced: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """vLLM's structured_outputs, or OpenAI's response_format in its terms; forced: a forced
    tool_choice's grammar (tool_choice.py), which takes the place of both."""
    fmt = req.response_format
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if forced is not None:
        if req.structured_outputs is not None or kind not in (None, "text"):
            raise bad_request("a forced tool_choice (required, or a named function) sets the output's grammar: "
                              "give no response_format or structured_outputs with it", param="tool_choice")
        return forced
    if req.structured_outputs is not None:
        if kind not in (None, "text"):
            raise bad_request("give response_format or structured_outputs, not both", param="response_format")
        return req.structured_outputs
    if kind in (None, "text"):
        return None
    if kind == "json_object":
        return {"json_object": True}
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise bad_request("response_format.json_schema.schema must be a JSON schema (an object)",
                              param="response_format")
        return {"json": schema}
    raise bad_request(f"response_format type {kind!r} is not supported (text, json_object, json_schema)",
                      param="response_format")


def sampling_params(req: _SamplingFields, max_tokens: int, num_logprobs: int | None,
                    prompt_logprobs: int | None = None, info: ModelInfo | None = None,
                    forced_structured_outputs: dict[str, Any] | None = None) -> SamplingParams:
    """The request's sampling, the model's defaults (info.sampling_defaults) for the fields it
    omits; a 400 that names the field when a value is out of range."""
    fields: dict[str, Any] = {"n": req.n, "max_tokens": max_tokens, "min_tokens": req.min_tokens,
                              "prompt_logprobs": prompt_logprobs,
                              "seed": req.seed, "ignore_eos": req.ignore_eos, "logprobs": num_logprobs,
                              "include_stop_str_in_output": req.include_stop_str_in_output}
    for name in ("temperature", "top_p", "top_k", "min_p", "stop", "stop_token_ids", "presence_penalty",
                 "frequency_penalty", "repetition_penalty", "bad_words", "allowed_token_ids"):
        value = getattr(req, name)
        if value is not None:
            fields[name] = value
    if req.logit_bias:
        fields["logit_bias"] = _token_keys(req.logit_bias)
    structured = structured_outputs(req, forced_structured_outputs)
    if structured is not None:
        fields["structured_outputs"] = structured
    try:
        return msgspec.convert(with_model_defaults(fields, info), SamplingParams)
    except msgspec.ValidationError as e:
        raise bad_request(f"invalid sampling parameters: {e}") from None
