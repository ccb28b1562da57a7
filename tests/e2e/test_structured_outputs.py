"""Structured outputs through real processes on a random-weight model, whose unconstrained
output is gibberish: only the grammar's mask can make these outputs valid.

Per run: 120 JSON requests across five schemas (nested objects, arrays, enums, bounded
numbers, required fields), plus regex, choice and EBNF grammar requests; half greedy, half
sampled; with async scheduling on (and a KV cache small enough to preempt by recompute, so
matchers replay) and off. 2 runs x 150 requests instead of the issue's 1,000: the suite must
stay fast on 2 cores; the count is a constant below. A string bounded by maxLength is where
xgrammar alone admits raw control characters (structured_outputs.bounded_strings_as_patterns)."""
import json
import re

import jsonschema
import pytest

from client_sdk import StructuredOutputsParams
from client_sdk.errors import RequestError
from stepserve import LLM, SamplingParams

NUM_JSON_REQUESTS = 120
SCHEMAS = [
    {"type": "object", "properties": {"id": {"type": "integer", "minimum": 1, "maximum": 999},
                                      "name": {"type": "string", "minLength": 1, "maxLength": 8},
                                      "active": {"type": "boolean"}},
     "required": ["id", "name", "active"], "additionalProperties": False},
    {"type": "object", "properties": {
        "user": {"type": "object", "properties": {"age": {"type": "integer", "minimum": 0, "maximum": 120},
                                                  "role": {"enum": ["admin", "user", "guest"]}},
                 "required": ["age", "role"], "additionalProperties": False},
        "scores": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9},
                   "minItems": 1, "maxItems": 4}},
     "required": ["user", "scores"], "additionalProperties": False},
    {"type": "object", "properties": {"qty": {"type": "integer", "exclusiveMinimum": 0, "maximum": 50},
                                      "level": {"type": "integer", "minimum": -20, "maximum": -10}},
     "required": ["qty", "level"], "additionalProperties": False},
    {"type": "array", "items": {"type": "object", "properties": {"k": {"enum": ["x", "y"]},
                                                                "v": {"type": "integer", "minimum": -5, "maximum": 5}},
                                "required": ["k", "v"], "additionalProperties": False},
     "minItems": 1, "maxItems": 3},
    {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]},
                                      "tags": {"type": "array", "items": {"type": "string", "pattern": "^[a-z]{2}$"},
                                               "maxItems": 2}},
     "required": ["color", "tags"], "additionalProperties": False},
]
REGEX = r"[A-Z]{2}-\d{3}"
CHOICES = ["positive", "negative", "neutral"]
GRAMMAR = 'root ::= "(" digit digit? ")" \ndigit ::= [0-9]'


def _requests() -> tuple[list[str], list[SamplingParams], list[tuple[str, object]]]:
    """prompts, their params, and what each output must be: ("json", schema) / ("regex", r) / ..."""
    prompts, params, expect = [], [], []

    def add(i: int, structured: StructuredOutputsParams, check) -> None:
        sampled = i % 2 == 1
        prompts.append(f"request {i}: answer")
        params.append(SamplingParams(temperature=0.8 if sampled else 0.0, seed=i if sampled else None,
                                     max_tokens=160, structured_outputs=structured))
        expect.append(check)

    for i in range(NUM_JSON_REQUESTS):
        schema = SCHEMAS[i % len(SCHEMAS)]
        add(i, StructuredOutputsParams(json=schema), ("json", schema))
    for i in range(10):
        add(i, StructuredOutputsParams(regex=REGEX), ("regex", REGEX))
        add(i, StructuredOutputsParams(choice=CHOICES), ("choice", CHOICES))
        add(i, StructuredOutputsParams(grammar=GRAMMAR), ("regex", r"\(\d\d?\)"))
    return prompts, params, expect


def check_output(text: str, finish_reason: str, expect) -> None:
    kind, spec = expect
    assert finish_reason == "stop", (text, expect)
    if kind == "json":
        jsonschema.validate(json.loads(text), spec)
    elif kind == "regex":
        assert re.fullmatch(spec, text), (text, spec)
    else:
        assert text in spec


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_every_constrained_output_is_valid(async_scheduling):
    prompts, params, expect = _requests()
    # With async scheduling, a KV cache of 48 blocks of 16 tokens for 150 requests: requests are
    # preempted by recompute and come back with their tokens, which fresh matchers replay.
    worker_args = ["--num-gpu-blocks", "48"] if async_scheduling else []
    with LLM(model="micro-llama", dtype="float32", kv_cache_gb=0.05, enforce_eager=True,
             async_scheduling=async_scheduling, worker_args=worker_args) as llm:
        outputs = llm.generate(prompts, params, use_tqdm=False)
        for output, check in zip(outputs, expect):
            check_output(output.outputs[0].text, output.outputs[0].finish_reason, check)
        assert len({o.outputs[0].text for o in outputs}) > 20  # the model, not a fixed string
        if async_scheduling:
            assert llm.client.health().num_preemptions > 0
        # The SDK's client directly: one request at a time, a stream too.
        one = llm.client.generate("sdk", params[1])
        check_output(one.outputs[0].text, one.outputs[0].finish_reason, expect[1])
        unconstrained = llm.generate(prompts[:4], SamplingParams(temperature=0.0, max_tokens=40), use_tqdm=False)
        assert not any(_is_valid(o.outputs[0].text, SCHEMAS[i]) for i, o in enumerate(unconstrained))


def _is_valid(text: str, schema) -> bool:
    try:
        jsonschema.validate(json.loads(text), schema)
        return True
    except (ValueError, jsonschema.ValidationError):
        return False


def test_a_bad_grammar_fails_its_request_alone():
    good = SamplingParams(temperature=0.0, max_tokens=40, structured_outputs=StructuredOutputsParams(regex=REGEX))
    bad = [StructuredOutputsParams(regex="(unclosed"), StructuredOutputsParams(grammar="root ::= undefined_rule"),
           StructuredOutputsParams(json={"type": "object", "properties": {"a": {"type": "no-such-type"}}})]
    # Async scheduling: the plan after the failing one is already in flight with those requests.
    with LLM(model="micro-llama", dtype="float32", kv_cache_gb=0.05, enforce_eager=True, async_scheduling=True) as llm:
        outputs = llm.generate(["a", "b", "c", "d"], [good] + [SamplingParams(structured_outputs=s) for s in bad],
                               use_tqdm=False)
        check_output(outputs[0].outputs[0].text, outputs[0].outputs[0].finish_reason, ("regex", REGEX))
        for output, kind in zip(outputs[1:], ("regex", "grammar", "json")):
            assert output.outputs[0].finish_reason == "error"
            assert output.outputs[0].error_code == "invalid_params"
            assert f"structured_outputs.{kind} does not compile" in output.outputs[0].error_message
        with pytest.raises(RequestError, match="does not compile"):
            llm.client.generate("x", SamplingParams(structured_outputs=bad[0]))
        again = llm.generate(["e"], good, use_tqdm=False)[0]  # and it serves on
        check_output(again.outputs[0].text, again.outputs[0].finish_reason, ("regex", REGEX))
    for fields in ({}, {"choice": []}, {"regex": "a", "choice": ["b"]}, {"json": "{not json"}):
        with pytest.raises(ValueError):  # refused by the SDK before sending
            SamplingParams(structured_outputs=StructuredOutputsParams(**fields))
