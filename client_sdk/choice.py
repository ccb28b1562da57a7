"""Choice: one completion's progress on the client, built from the scheduler's outputs.

A prompt with n choices is n requests on the scheduler; each has a Choice here that collects
its tokens and logprobs and, when the request has stop strings, detokenizes as tokens arrive,
so that a match ends the choice at once (the caller then aborts the request on the scheduler).
"""
import msgspec

from client_sdk.completion_text import CompletionText
from client_sdk.outputs import CompletionOutput, vllm_logprobs
from client_sdk.tokenizer import TextCodec
from protocol.client_messages import RequestOutput as WireOutput
from protocol.pooling import PoolingParams
from protocol.sampling import SamplingParams


# What a pooling request sends as its SamplingParams, which the scheduler ignores.
POOLING_SAMPLING = SamplingParams(max_tokens=1)


def validated(params: SamplingParams | None) -> SamplingParams:
    """Checks the field ranges here, so a bad value fails at the caller, not on the server."""
    params = params or SamplingParams()
    try:
        return msgspec.convert(msgspec.to_builtins(params), SamplingParams)
    except msgspec.ValidationError as e:
        raise ValueError(f"invalid sampling params: {e}") from None


def validated_pooling(params: PoolingParams | None) -> PoolingParams:
    """validated, for a pooling request's params."""
    try:
        return msgspec.convert(msgspec.to_builtins(params or PoolingParams()), PoolingParams)
    except msgspec.ValidationError as e:
        raise ValueError(f"invalid pooling params: {e}") from None


def params_per_prompt(params, num_prompts: int) -> list[SamplingParams]:
    """One SamplingParams for all prompts, or one each: validated, one per prompt."""
    if params is None or isinstance(params, SamplingParams):
        return [validated(params)] * num_prompts
    params = list(params)
    if len(params) != num_prompts:
        raise ValueError(f"{len(params)} sampling params for {num_prompts} prompts: give one, or one per prompt")
    checked: dict[int, SamplingParams] = {}  # the same object for many prompts: checked once
    for p in params:
        if id(p) not in checked:
            checked[id(p)] = validated(p)
    return [checked[id(p)] for p in params]


def choice_params(params: SamplingParams, index: int) -> SamplingParams:
    """What the scheduler gets for choice `index`: n = 1, no stop strings (the SDK's), and
    seed + index when seeded, so the n choices differ (vLLM's rule)."""
    seed = params.seed + index if params.seed is not None else None
    if params.n == 1 and not params.stop and not params.include_stop_str_in_output:
        return params
    return msgspec.structs.replace(params, n=1, stop=[], include_stop_str_in_output=False, seed=seed)


class Choice:
    __slots__ = ("index", "params", "codec", "token_ids", "token_logprobs", "finish_reason", "stop_reason",
                 "error_code", "error_message", "text", "prompt_token_logprobs", "pooled")

    def __init__(self, index: int, params: SamplingParams, codec: TextCodec | None, incremental: bool):
        """incremental: detokenize as tokens arrive (streams, stop strings); else once at the end."""
        self.index = index
        self.params = params
        self.codec = codec
        self.token_ids: list[int] = []
        self.token_logprobs: list | None = [] if params.logprobs is not None else None
        self.finish_reason: str | None = None
        self.stop_reason: str | int | None = None
        self.error_code: str | None = None
        self.error_message: str | None = None
        self.text = CompletionText(codec, params) if codec is not None and incremental else None
        self.prompt_token_logprobs: list | None = None  # the wire's, prompt tokens 1..n-1
        self.pooled: bytes | None = None  # a pooling request's values, as the wire has them

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def stopped_by_string(self) -> bool:
        """Ended here, not on the scheduler: the request there still runs until aborted."""
        return self.text is not None and self.text.stop_reason is not None

    def add(self, output: WireOutput) -> tuple[list[int], list | None]:
        """Appends the output's tokens; returns the new tokens and logprobs that belong to the
        completion (those after a stop string's match do not)."""
        if output.finish_reason == "error":
            self.finish_reason, self.error_code, self.error_message = "error", output.error_code, output.error_message
            return [], None
        new_ids, new_logprobs, finish_reason = output.new_token_ids, output.logprobs, output.finish_reason
        if output.prompt_logprobs is not None:
            self.prompt_token_logprobs = output.prompt_logprobs
        if output.pooled is not None:
            self.pooled = output.pooled
        if self.text is not None:
            num_kept = self.text.push(new_ids)
            if num_kept is not None:
                new_ids, finish_reason = new_ids[:num_kept], "stop"
                new_logprobs = new_logprobs[:num_kept] if new_logprobs else new_logprobs
                self.stop_reason = self.text.stop_reason
        self.token_ids.extend(new_ids)
        if new_logprobs and self.token_logprobs is not None:
            self.token_logprobs.extend(new_logprobs)
        if finish_reason is not None:
            self.finish_reason = finish_reason
            if finish_reason == "stop" and self.stop_reason is None and self.token_ids \
                    and self.token_ids[-1] in (self.params.stop_token_ids or ()):
                self.stop_reason = self.token_ids[-1]
            if self.text is not None:
                self.text.finish(self.token_ids)
        return new_ids, new_logprobs

    def output(self) -> CompletionOutput:
        if self.text is not None:
            text = self.text.text
        else:
            text = self.codec.decode(self.token_ids) if self.codec is not None else None
        logprobs = cumulative = None
        if self.token_logprobs is not None:
            decode_each = self.codec.decode_each if self.codec is not None else None
            logprobs = vllm_logprobs(self.token_logprobs, decode_each)
            cumulative = sum(step.logprob for step in self.token_logprobs)
        return CompletionOutput(self.index, text, self.token_ids, cumulative, logprobs, self.finish_reason,
                                self.stop_reason, self.token_logprobs, self.error_code, self.error_message)
