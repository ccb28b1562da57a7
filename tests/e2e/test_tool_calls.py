"""Tool calls and reasoning output through the real gateway, scheduler and worker, driven with the
`openai` client, on random-weight Qwen3 and Llama 3 folders with chat templates in their
families' formats (tests/chat_templates.py). A random model never calls a tool of its own
accord, so what is checked end to end is what a grammar forces (a named tool_choice, `required`,
a reasoning span) and how conversations with tools render; the parsers of free output are
checked on texts in tests/unit."""
import json
import re

import jsonschema
import openai
import pytest

from stepserve import LLM, SamplingParams
from stepserve.launcher import LocalCluster
from tests.chat_templates import LLAMA31_JSON, QWEN3
from tests.e2e_helpers import TEST_WORKER_ARGS
from tests.gateway_helpers import start_gateways
from tests.hf_model_folders import make_llama_folder, make_qwen3_folder, write_chat_template

WEATHER = {"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo", "Lima"]},
                                            "unit": {"enum": ["c", "f"]}},
           "required": ["city", "unit"], "additionalProperties": False}
TIME = {"type": "object", "properties": {"zone": {"type": "string", "pattern": "^[A-Z]{3}$"}},
        "required": ["zone"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "description": "The time in a zone",
                                           "parameters": TIME}}]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
USER = [{"role": "user", "content": "What is the weather in Paris?"}]
CONVERSATION = USER + [
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather",
                                                          "arguments": '{"city": "Paris", "unit": "c"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "21 degrees, sunny"}]
GREEDY = {"temperature": 0.0, "max_tokens": 60}
ROOM = {"max_position_embeddings": 4096}  # the tools' schemas in the prompt: ~2,000 tokens of a byte tokenizer


def _cluster(folder: str):
    cluster = LocalCluster(folder, 1, worker_args=TEST_WORKER_ARGS)
    cluster.start()
    cluster.parsing_url, cluster.plain_url = start_gateways(
        cluster, ["--served-model-name", "m", "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
                  "--reasoning-parser", "qwen3"], ["--served-model-name", "m"])
    return cluster


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    folder = write_chat_template(make_qwen3_folder(str(tmp_path_factory.mktemp("qwen3") / "m"), **ROOM), QWEN3)
    cluster = _cluster(folder)
    yield folder, cluster
    cluster.stop()


@pytest.fixture(scope="module")
def llama3(tmp_path_factory):
    folder = write_chat_template(make_llama_folder(str(tmp_path_factory.mktemp("llama3") / "m"), **ROOM),
                                 LLAMA31_JSON)
    cluster = _cluster(folder)
    yield folder, cluster
    cluster.stop()


def _api(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


def _check_call(call_name: str, arguments: str) -> None:
    assert call_name in SCHEMAS
    jsonschema.validate(json.loads(arguments), SCHEMAS[call_name])


def _streamed_calls(chunks) -> dict[int, dict]:
    """The tool calls of a stream, put together as OpenAI's clients do: the id and the name come
    first, then the arguments in fragments."""
    calls: dict[int, dict] = {}
    for chunk in chunks:
        deltas = (chunk.choices[0].delta.tool_calls if chunk.choices else None) or []
        for delta in deltas:
            if delta.index not in calls:
                assert delta.id and delta.function.name, "a call's first delta carries its id and name"
                calls[delta.index] = {"id": delta.id, "name": delta.function.name, "arguments": ""}
            calls[delta.index]["arguments"] += delta.function.arguments or ""
    return calls


@pytest.mark.parametrize("family", ["qwen3", "llama3"])
def test_a_named_tool_choice_gives_a_call_whose_arguments_validate(family, request):
    _, cluster = request.getfixturevalue(family)
    api = _api(cluster.plain_url)  # forced choices need no parser flags
    choice = {"type": "function", "function": {"name": "get_weather"}}
    r = api.chat.completions.create(model="m", messages=USER, tools=TOOLS, tool_choice=choice, **GREEDY)
    message = r.choices[0].message
    assert len(message.tool_calls) == 1 and message.tool_calls[0].type == "function"
    assert message.tool_calls[0].function.name == "get_weather" and message.tool_calls[0].id.startswith("chatcmpl-tool-")
    _check_call("get_weather", message.tool_calls[0].function.arguments)
    assert r.choices[0].finish_reason == "stop"
    chunks = list(api.chat.completions.create(model="m", messages=USER, tools=TOOLS, tool_choice=choice, stream=True,
                                              **GREEDY))
    calls = _streamed_calls(chunks)
    assert list(calls) == [0] and calls[0]["name"] == "get_weather"
    assert calls[0]["arguments"] == message.tool_calls[0].function.arguments  # greedy: the same output
    assert sum(1 for c in chunks if c.choices and c.choices[0].delta.tool_calls) > 1, "arguments in fragments"


def test_required_gives_one_or_more_calls_of_the_tools_streamed_or_not(qwen3):
    _, cluster = qwen3
    api = _api(cluster.plain_url)
    sampled = {"tools": TOOLS, "tool_choice": "required", "temperature": 1.0, "max_tokens": 300}
    numbers_of_calls = []
    for seed in range(6):
        r = api.chat.completions.create(model="m", messages=USER, seed=seed, **sampled)
        calls = r.choices[0].message.tool_calls
        if r.choices[0].finish_reason == "length":  # the grammar let the sampled array go on past max_tokens
            assert calls is None and r.choices[0].message.content is None
            continue
        assert calls and r.choices[0].finish_reason == "tool_calls"
        for call in calls:
            _check_call(call.function.name, call.function.arguments)
        streamed = _streamed_calls(api.chat.completions.create(model="m", messages=USER, seed=seed, stream=True,
                                                               **sampled))
        assert [(c["name"], c["arguments"]) for c in streamed.values()] == [
            (c.function.name, c.function.arguments) for c in calls]
        numbers_of_calls.append(len(calls))
    assert numbers_of_calls and max(numbers_of_calls) > 1, numbers_of_calls  # a random model calls in parallel
    single = api.chat.completions.create(model="m", messages=USER, tools=TOOLS, tool_choice="required",
                                         parallel_tool_calls=False, **GREEDY)
    assert len(single.choices[0].message.tool_calls) == 1


def test_auto_needs_the_parser_flags_and_returns_content_when_no_call_is_made(qwen3):
    _, cluster = qwen3
    with pytest.raises(openai.BadRequestError, match="--enable-auto-tool-choice"):
        _api(cluster.plain_url).chat.completions.create(model="m", messages=USER, tools=TOOLS, **GREEDY)
    r = _api(cluster.parsing_url).chat.completions.create(
        model="m", messages=USER, tools=TOOLS,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}, "ignore_eos": True}, **GREEDY)
    message = r.choices[0].message
    assert message.tool_calls is None and isinstance(message.content, str)  # random weights: no call
    assert r.choices[0].finish_reason == "length"
    none = _api(cluster.plain_url).chat.completions.create(model="m", messages=USER, tools=TOOLS, tool_choice="none",
                                                           extra_body={"ignore_eos": True}, **GREEDY)
    assert none.choices[0].message.tool_calls is None and none.choices[0].message.content


@pytest.mark.parametrize("bad, message", [
    ({"tool_choice": "required"}, "`tools` must be set"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "'nope' has not been passed"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice must be"),
    ({"tools": [{"type": "function", "function": {"description": "no name"}}], "tool_choice": "none"}, "each tool"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "forced tool_choice"),
])
def test_wrong_tools_or_tool_choice_get_a_400_naming_the_field(qwen3, bad, message):
    _, cluster = qwen3
    with pytest.raises(openai.BadRequestError, match=message):
        _api(cluster.plain_url).chat.completions.create(model="m", messages=USER, **GREEDY, **bad)


@pytest.mark.parametrize("family", ["qwen3", "llama3"])
def test_a_conversation_with_tool_messages_renders_as_transformers_renders_it_and_runs(family, request):
    from transformers import AutoTokenizer
    folder, cluster = request.getfixturevalue(family)
    # transformers' templates take the arguments as an object (vLLM parses OpenAI's JSON text so).
    for_transformers = [m if "tool_calls" not in m else {**m, "tool_calls": [
        {**c, "function": {**c["function"], "arguments": json.loads(c["function"]["arguments"])}}
        for c in m["tool_calls"]]} for m in CONVERSATION]
    expected = AutoTokenizer.from_pretrained(folder).apply_chat_template(
        for_transformers, tools=TOOLS, add_generation_prompt=True, tokenize=True, return_dict=False)
    r = _api(cluster.plain_url).chat.completions.create(
        model="m", messages=CONVERSATION, tools=TOOLS, tool_choice="none",
        extra_body={"return_token_ids": True, "ignore_eos": True}, **GREEDY)
    assert r.prompt_token_ids == list(expected)
    assert len(r.choices[0].token_ids) == GREEDY["max_tokens"]


def test_reasoning_goes_to_reasoning_content_and_a_grammar_holds_after_it(qwen3):
    _, cluster = qwen3
    api = _api(cluster.parsing_url)
    free = {"ignore_eos": True}
    # Thinking on: a random model never closes its think block, so all of it is reasoning.
    r = api.chat.completions.create(model="m", messages=USER, extra_body=free, **GREEDY)
    reasoning = r.choices[0].message.reasoning_content
    assert reasoning and r.choices[0].message.content is None
    text = _api(cluster.plain_url).chat.completions.create(model="m", messages=USER, extra_body=free,
                                                           **GREEDY).choices[0].message.content
    assert text == reasoning  # without --reasoning-parser, the same text as content
    chunks = list(api.chat.completions.create(model="m", messages=USER, extra_body=free, stream=True, **GREEDY))
    assert "".join(getattr(c.choices[0].delta, "reasoning_content", None) or "" for c in chunks if c.choices) == reasoning
    # A grammar is the answer's: it waits for </think>, so the reasoning is not held to it ...
    answer = {"structured_outputs": {"regex": "[a-z]{1,12}"}, "ignore_eos": True}
    r = api.chat.completions.create(model="m", messages=USER, extra_body=answer, **GREEDY)
    assert r.choices[0].message.reasoning_content == reasoning and r.choices[0].message.content is None
    # ... and with thinking off (the template closes the think block) it holds from the first token.
    off = {**answer, "chat_template_kwargs": {"enable_thinking": False}, "ignore_eos": False}
    r = api.chat.completions.create(model="m", messages=USER, extra_body=off, **GREEDY)
    assert r.choices[0].message.reasoning_content is None
    assert re.fullmatch("[a-z]{1,12}", r.choices[0].message.content)


def test_llm_chat_renders_the_tools_into_the_prompt(qwen3):
    from transformers import AutoTokenizer
    folder, _ = qwen3
    expected = AutoTokenizer.from_pretrained(folder).apply_chat_template(
        USER, tools=TOOLS, add_generation_prompt=True, tokenize=True, return_dict=False)
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    with LLM(model=folder, enforce_eager=True, data_parallel_size=1, kv_cache_gb=0.05) as llm:
        out = llm.chat(USER, params, tools=TOOLS, use_tqdm=False)[0]
    assert out.prompt_token_ids == list(expected)
