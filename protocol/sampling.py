"""SamplingParams: how to pick the next token and when to stop, validated on decode."""
import json
from typing import Annotated, Any

import msgspec

from protocol.limits import (MAX_ALLOWED_TOKEN_IDS, MAX_BAD_WORDS, MAX_CHOICES, MAX_GRAMMAR_LEN, MAX_LOGIT_BIAS,
                             MAX_LOGPROBS, MAX_N, MAX_STOP_STRING_LEN, MAX_STOP_STRINGS, MAX_STOP_TOKEN_IDS,
                             MAX_TOKENS)

TokenId = Annotated[int, msgspec.Meta(ge=0)]
Penalty = Annotated[float, msgspec.Meta(ge=-2.0, le=2.0)]
Bias = Annotated[float, msgspec.Meta(ge=-100.0, le=100.0)]


class StructuredOutputsParams(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """vLLM's: exactly one constraint on the output text. json: a JSON schema (a dict, or its
    text); json_object: any JSON object; regex: the text full-matches it; choice: the text is one
    of these strings; grammar: an EBNF grammar (GBNF/xgrammar syntax, root rule `root`).
    after_token_ids: where the constrained text begins (after a reasoning span).

    Checked here for shape; whether the schema, regex or grammar compiles is the worker's
    grammar engine's to say (worker_svc/structured_outputs.py), which fails that request alone."""

    json: dict[str, Any] | str | None = None
    json_object: bool = False
    regex: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_GRAMMAR_LEN)] | None = None
    choice: Annotated[list[Annotated[str, msgspec.Meta(max_length=MAX_GRAMMAR_LEN)]],
                      msgspec.Meta(max_length=MAX_CHOICES)] | None = None
    grammar: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_GRAMMAR_LEN)] | None = None
    # The constraint holds from just after these tokens first appear in the output (a reasoning
    # model's end of thinking, "</think>": the gateway's --reasoning-parser sets it); before them
    # the output is free. None: from the first token.
    after_token_ids: Annotated[list[TokenId], msgspec.Meta(min_length=1, max_length=MAX_STOP_TOKEN_IDS)] | None = None

    def __post_init__(self):
        kinds = [name for name in ("json", "regex", "choice", "grammar") if getattr(self, name) is not None]
        kinds += ["json_object"] if self.json_object else []
        if len(kinds) != 1:
            raise ValueError(f"structured_outputs takes exactly one of json, json_object, regex, choice, grammar; "
                             f"got {kinds or 'none'}")
        if self.choice is not None and not self.choice:
            raise ValueError("structured_outputs.choice must not be empty")
        if isinstance(self.json, str):
            if len(self.json) > MAX_GRAMMAR_LEN:
                raise ValueError(f"structured_outputs.json is longer than {MAX_GRAMMAR_LEN} characters")
            try:
                schema = json.loads(self.json)
            except ValueError as e:
                raise ValueError(f"structured_outputs.json is not valid JSON: {e}") from None
            if not isinstance(schema, (dict, bool)):
                raise ValueError("structured_outputs.json must be a JSON schema (an object)")


class SamplingParams(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True, gc=False):
    """Per-request sampling, with vLLM's defaults and conventions.

    temperature 0 means greedy. top_k 0 or -1 means "no top-k" (vLLM's old and new
    convention, both accepted). top_p 1 and min_p 0 disable those filters. A seed makes the
    request's samples reproducible whatever else is in the batch. logprobs=N asks for the
    sampled token's logprob plus the top N alternatives per step.

    Penalties and bias, vLLM's and OpenAI's definitions (worker_svc/logits_processors.py):
    presence_penalty / frequency_penalty in [-2, 2] over the generated tokens; repetition_penalty
    > 0 (1 = off) over prompt and generated tokens; logit_bias maps token id -> bias in
    [-100, 100], added to the logits; bad_words are never generated (each word tokenized by the
    worker with and without a leading space); allowed_token_ids, when given, are the only tokens
    that may be sampled. structured_outputs constrains the text to a JSON schema, a regex, a
    choice or a grammar (StructuredOutputsParams).

    n, stop and include_stop_str_in_output are the SDK's (the scheduler only sees token ids):
    the SDK sends n requests with seeds seed, seed + 1, ... (vLLM's rule), matches the stop
    strings on the text it detokenizes, aborts the request at a match and cuts the text before
    the stop string (after it with include_stop_str_in_output). What reaches the scheduler has
    n = 1 and no stop strings (it refuses others).
    """

    n: Annotated[int, msgspec.Meta(ge=1, le=MAX_N)] = 1
    max_tokens: Annotated[int, msgspec.Meta(ge=1, le=MAX_TOKENS)] = 16
    min_tokens: Annotated[int, msgspec.Meta(ge=0, le=MAX_TOKENS)] = 0
    temperature: Annotated[float, msgspec.Meta(ge=0.0)] = 1.0
    top_p: Annotated[float, msgspec.Meta(gt=0.0, le=1.0)] = 1.0
    top_k: Annotated[int, msgspec.Meta(ge=-1)] = 0
    min_p: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)] = 0.0
    seed: int | None = None
    stop_token_ids: Annotated[list[TokenId], msgspec.Meta(max_length=MAX_STOP_TOKEN_IDS)] | None = None
    ignore_eos: bool = False
    logprobs: Annotated[int, msgspec.Meta(ge=0, le=MAX_LOGPROBS)] | None = None
    stop: (Annotated[str, msgspec.Meta(max_length=MAX_STOP_STRING_LEN)]
           | Annotated[list[Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_STOP_STRING_LEN)]],
                       msgspec.Meta(max_length=MAX_STOP_STRINGS)] | None) = None
    include_stop_str_in_output: bool = False
    presence_penalty: Penalty = 0.0
    frequency_penalty: Penalty = 0.0
    repetition_penalty: Annotated[float, msgspec.Meta(gt=0.0)] = 1.0
    logit_bias: Annotated[dict[TokenId, Bias], msgspec.Meta(max_length=MAX_LOGIT_BIAS)] | None = None
    bad_words: Annotated[list[Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_STOP_STRING_LEN)]],
                         msgspec.Meta(max_length=MAX_BAD_WORDS)] | None = None
    allowed_token_ids: Annotated[list[TokenId], msgspec.Meta(min_length=1, max_length=MAX_ALLOWED_TOKEN_IDS)] | None = None
    structured_outputs: StructuredOutputsParams | None = None
    # vLLM's: per prompt token (after the first) its logprob given what precedes it, plus the top K.
    prompt_logprobs: Annotated[int, msgspec.Meta(ge=0, le=MAX_LOGPROBS)] | None = None

    def __post_init__(self):
        if self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens ({self.min_tokens}) > max_tokens ({self.max_tokens})")
        if self.temperature != self.temperature or self.temperature == float("inf"):
            raise ValueError("temperature must be finite")
        if isinstance(self.stop, str):
            if not self.stop:
                raise ValueError("a stop string must not be empty")
            self.stop = [self.stop]
        if self.repetition_penalty == float("inf"):
            raise ValueError("repetition_penalty must be finite")

    @property
    def has_penalties(self) -> bool:
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0)


class SamplingDefaults(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """A model's own sampling defaults: its folder's generation_config.json, unless the worker
    runs with --generation-config vllm. A request that leaves a field unset takes the value here
    (None: SamplingParams' default), as vLLM does; the SDK applies them (client_sdk/model_defaults.py).
    The worker reads them, its hello and ModelInfo carry them; each is a SamplingParams field."""

    temperature: Annotated[float, msgspec.Meta(ge=0.0)] | None = None
    top_p: Annotated[float, msgspec.Meta(gt=0.0, le=1.0)] | None = None
    top_k: Annotated[int, msgspec.Meta(ge=-1)] | None = None
    min_p: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)] | None = None
    repetition_penalty: Annotated[float, msgspec.Meta(gt=0.0)] | None = None
    max_tokens: Annotated[int, msgspec.Meta(ge=1)] | None = None  # the file's max_new_tokens, as vLLM reads it
