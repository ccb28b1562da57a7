"""A chat choice's output as a message (gateway_svc/chat_output.py): the reasoning parser first,
then the tool-call parser on what follows it, or a forced tool choice's grammar output; a
stream cut anywhere adds up to the whole output's message."""
import json

import pytest

from gateway_svc.chat_output import ChoiceOutput
from gateway_svc.chat_parsing import ChatParsing
from gateway_svc.tool_choice import ToolChoice

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},
         {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}]
HERMES_AND_QWEN3 = ChatParsing("hermes", True, "qwen3")
THINK_THEN_CALL = ('<think>\nThe user wants the weather.\n</think>\n\nLet me check.\n<tool_call>\n'
                   '{"name": "get_weather", "arguments": {"city": "Zürich"}}\n</tool_call>')


def _streamed(output: ChoiceOutput, pieces: list[str]) -> dict:
    """The deltas of a stream put together: reasoning, content, and each call's name and arguments."""
    reasoning, content, calls = "", "", {}
    for i, piece in enumerate(pieces):
        delta = output.delta(piece, final=i == len(pieces) - 1)
        reasoning += delta.get("reasoning_content", "")
        content += delta.get("content", "")
        for call in delta.get("tool_calls", []):
            if call["index"] not in calls:
                calls[call["index"]] = {"name": call["function"]["name"], "arguments": ""}
            calls[call["index"]]["arguments"] += call["function"]["arguments"]
    return {"reasoning": reasoning, "content": content, "calls": list(calls.values())}


def _whole(message: dict) -> dict:
    return {"reasoning": message.get("reasoning_content") or "", "content": message["content"] or "",
            "calls": [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
                      for c in message.get("tool_calls", [])]}


def test_reasoning_then_content_then_a_call():
    output = ChoiceOutput(HERMES_AND_QWEN3, ToolChoice("auto", TOOLS))
    message = output.message(THINK_THEN_CALL)
    assert message["reasoning_content"] == "\nThe user wants the weather.\n"
    assert message["content"].strip() == "Let me check."
    [call] = message["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("chatcmpl-tool-")
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Zürich"}
    assert output.finish_reason("stop") == "tool_calls" and output.finish_reason("length") == "length"


@pytest.mark.parametrize("cut", range(0, len(THINK_THEN_CALL) + 1, 3))
def test_a_stream_cut_anywhere_gives_the_whole_message(cut):
    whole = _whole(ChoiceOutput(HERMES_AND_QWEN3, ToolChoice("auto", TOOLS)).message(THINK_THEN_CALL))
    output = ChoiceOutput(HERMES_AND_QWEN3, ToolChoice("auto", TOOLS))
    assert _streamed(output, [THINK_THEN_CALL[:cut], THINK_THEN_CALL[cut:]]) == whole
    assert output.called


def test_char_by_char_gives_the_whole_message():
    whole = _whole(ChoiceOutput(HERMES_AND_QWEN3, ToolChoice("auto", TOOLS)).message(THINK_THEN_CALL))
    assert _streamed(ChoiceOutput(HERMES_AND_QWEN3, ToolChoice("auto", TOOLS)), list(THINK_THEN_CALL)) == whole


def test_none_and_no_parsers_leave_the_text_as_content():
    for parsing, choice in ((ChatParsing(), ToolChoice("none")), (HERMES_AND_QWEN3, ToolChoice("none", TOOLS))):
        output = ChoiceOutput(parsing, choice)
        text = THINK_THEN_CALL if parsing.reasoning_parser is None else "plain answer"
        message = output.message("<think>r</think>" + text if parsing.reasoning_parser else text)
        assert message["content"] == text and "tool_calls" not in message
        assert output.finish_reason("stop") == "stop"


def test_thinking_off_makes_everything_content():
    output = ChoiceOutput(HERMES_AND_QWEN3, ToolChoice("none", TOOLS), {"enable_thinking": False})
    assert output.message("no thoughts here") == {"role": "assistant", "content": "no thoughts here",
                                                  "reasoning_content": None}


def test_a_named_choice_streams_its_id_and_name_first_then_the_arguments():
    choice = ToolChoice("named", TOOLS, name="get_time")
    thinking_off = {"enable_thinking": False}  # else the grammar's output follows a think block
    output = ChoiceOutput(HERMES_AND_QWEN3, choice, thinking_off)
    first, second = output.delta('{"zone": ', final=False), output.delta('"UTC"}', final=True)
    assert first["tool_calls"][0]["id"].startswith("chatcmpl-tool-") and first["tool_calls"][0]["type"] == "function"
    assert first["tool_calls"][0]["function"] == {"name": "get_time", "arguments": '{"zone": '}
    assert second["tool_calls"] == [{"index": 0, "function": {"arguments": '"UTC"}'}}]
    assert output.finish_reason("stop") == "stop"  # as vLLM reports a named choice
    message = ChoiceOutput(HERMES_AND_QWEN3, choice, thinking_off).message('{"zone": "UTC"}')
    assert message["content"] is None and message["tool_calls"][0]["function"]["arguments"] == '{"zone": "UTC"}'
    assert message["reasoning_content"] is None
    after_thinking = ChoiceOutput(HERMES_AND_QWEN3, choice).message('<think>UTC?</think>{"zone": "UTC"}')
    assert after_thinking["reasoning_content"] == "UTC?"
    assert after_thinking["tool_calls"][0]["function"]["arguments"] == '{"zone": "UTC"}'


def test_required_parses_the_array_its_grammar_made():
    choice = ToolChoice("required", TOOLS)
    text = '[{"name": "get_time", "parameters": {"zone": "UTC"}}, {"name": "get_weather", "parameters": {}}]'
    message = ChoiceOutput(ChatParsing(), choice).message(text)
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message["tool_calls"]] == [
        ("get_time", {"zone": "UTC"}), ("get_weather", {})]
    assert _streamed(ChoiceOutput(ChatParsing(), choice), [text[:20], text[20:]]) == _whole(message)
    assert ChoiceOutput(ChatParsing(), choice).message(text[:30]) == {"role": "assistant", "content": None}


def test_the_grammar_of_a_forced_choice():
    schema = {"type": "object", "properties": {"zone": {"type": "string"}}}
    tools = [{"type": "function", "function": {"name": "get_time", "parameters": schema}},
             {"type": "function", "function": {"name": "ping"}}]
    assert ToolChoice("named", tools, name="get_time").structured_outputs() == {"json": schema}
    required = ToolChoice("required", tools, parallel=False).structured_outputs()["json"]
    assert required["minItems"] == 1 and required["maxItems"] == 1
    assert [item["properties"]["name"]["enum"] for item in required["items"]["anyOf"]] == [["get_time"], ["ping"]]
    assert required["items"]["anyOf"][1]["properties"]["parameters"] == {"type": "object", "properties": {}}
    assert ToolChoice("auto", tools).structured_outputs() is None


@pytest.mark.parametrize("flags, error", [
    (("nope", False, None), "--tool-call-parser"), ((None, False, "nope"), "--reasoning-parser"),
    ((None, True, None), "needs --tool-call-parser")])
def test_flags_that_do_not_go_together(flags, error):
    with pytest.raises(ValueError, match=error):
        ChatParsing(*flags)
