"""gateway_svc/tool_parsers.py: the calls and content vLLM's hermes, llama3_json and mistral parsers find
in a whole output (the expected values read off vLLM's extract_tool_calls), and a stream of the same
text, cut anywhere, giving the same."""
import json
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway_svc.tool_parsers import _BROKEN, _COMPLETE, _OPEN, TOOL_PARSERS, ToolCall, _JsonScanner

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
WEATHER = '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}'
WEATHER_ARGS = '{"city": "Paris", "unit": "celsius"}'

# (text, content, [(name, arguments)])
HERMES = {
    "no_call": ("The weather in Paris is sunny.", "The weather in Paris is sunny.", []),
    "one_call": (f"<tool_call>\n{WEATHER}\n</tool_call>", None, [("get_weather", WEATHER_ARGS)]),
    "content_before": (f"Let me check.\n<tool_call>\n{WEATHER}\n</tool_call>", "Let me check.\n",
                       [("get_weather", WEATHER_ARGS)]),
    "several": (f'<tool_call>\n{WEATHER}\n</tool_call>\n<tool_call>\n{{"name": "get_time", "arguments": {{}}}}\n'
                "</tool_call>", None, [("get_weather", WEATHER_ARGS), ("get_time", "{}")]),
    "compact_json_reserialized": (
        '<tool_call>{"name":"add","arguments":{"a":1,"b":[2,3.5e1,-0,true,null]}}</tool_call>', None,
        [("add", '{"a": 1, "b": [2, 35.0, 0, true, null]}')]),
    "unicode": (
        '<tool_call>\n{"name": "translate", "arguments": {"text": "日本語", "to": "\\u00e9t\\u00e9 😀 \\ud83d\\ude00"}}'
        "\n</tool_call>", None, [("translate", '{"text": "日本語", "to": "été 😀 😀"}')]),
    "arguments_as_json_string": ('<tool_call>{"name": "f", "arguments": "{\\"x\\": \\"ü\\"}"}</tool_call>', None,
                                 [("f", '{"x": "ü"}')]),
    "unterminated_last_call": ('<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n', None, [("f", '{"a": 1}')]),
    "text_after_the_calls_dropped": (f"<tool_call>{WEATHER}</tool_call>\nI'll wait for it.", None,
                                     [("get_weather", WEATHER_ARGS)]),
    "whitespace_before_is_no_content": (f"\n\n<tool_call>{WEATHER}</tool_call>", None, [("get_weather", WEATHER_ARGS)]),
    "broken_json": ('Sure.<tool_call>\n{"name": "f", "arguments": {"a": }\n</tool_call>',
                    'Sure.<tool_call>\n{"name": "f", "arguments": {"a": }\n</tool_call>', []),
    "no_arguments": ('<tool_call>{"name": "f"}</tool_call>', '<tool_call>{"name": "f"}</tool_call>', []),
    "not_an_object": ('<tool_call>["f", {}]</tool_call>', '<tool_call>["f", {}]</tool_call>', []),
    "name_not_a_string": ('<tool_call>{"name": 3, "arguments": {}}</tool_call>',
                          '<tool_call>{"name": 3, "arguments": {}}</tool_call>', []),
    "arguments_string_not_json": ('<tool_call>{"name": "f", "arguments": "x=1"}</tool_call>',
                                  '<tool_call>{"name": "f", "arguments": "x=1"}</tool_call>', []),
    "cut_off_by_max_tokens": ('<tool_call>\n{"name": "f", "arguments": {"city": "Par',
                              '<tool_call>\n{"name": "f", "arguments": {"city": "Par', []),
    "text_after_the_json_in_the_block": ('<tool_call>{"name": "f", "arguments": {}} ok</tool_call>',
                                         '<tool_call>{"name": "f", "arguments": {}} ok</tool_call>', []),
    # vLLM's block ends at the first end tag, in a JSON string or not
    "end_tag_in_a_string": ('<tool_call>{"name": "f", "arguments": {"s": "</tool_call>"}}</tool_call>',
                            '<tool_call>{"name": "f", "arguments": {"s": "</tool_call>"}}</tool_call>', []),
    "tag_like_text": ("a < b, <tool_ and <tool_call", "a < b, <tool_ and <tool_call", []),
    "end_tag_alone": ("Close it with </tool_call>.", "Close it with </tool_call>.", []),
    # vLLM gives all as content once any block is broken; a call that parsed stays one here, as a stream sent it
    "broken_then_call": ('<tool_call>oops</tool_call>\n<tool_call>{"name": "f", "arguments": {}}</tool_call>',
                         "<tool_call>oops</tool_call>\n", [("f", "{}")]),
    "call_then_broken": ('<tool_call>{"name": "f", "arguments": {}}</tool_call>\n<tool_call>oops</tool_call>', None,
                         [("f", "{}")]),
}

LLAMA = {
    "no_call": ("Paris is sunny today.", "Paris is sunny today.", []),
    "parameters": ('{"name": "get_weather", "parameters": {"city": "Paris"}}', None,
                   [("get_weather", '{"city": "Paris"}')]),
    "python_tag": ('<|python_tag|>{"name": "search", "parameters": {"query": "vLLM"}}', None,
                   [("search", '{"query": "vLLM"}')]),
    "arguments": ('{"name": "f", "arguments": {"a": 1}}', None, [("f", '{"a": 1}')]),
    "arguments_before_parameters": ('{"name": "f", "arguments": {"a": 1}, "parameters": {"b": 2}}', None,
                                    [("f", '{"a": 1}')]),
    "several": ('{"name": "f", "parameters": {"a": 1}}; {"name": "g", "parameters": {"b": "ü"}}', None,
                [("f", '{"a": 1}'), ("g", '{"b": "ü"}')]),
    "unicode_and_escapes_reserialized": ('{"name":"f","parameters":{"s":"\\u65e5\\n\\/","n":1E2,"z":[ ]}}', None,
                                         [("f", '{"s": "日\\n/", "n": 100.0, "z": []}')]),
    "parameters_as_a_string_kept_a_string": ('{"name": "f", "parameters": "{\\"a\\": 1}"}', None,
                                             [("f", '"{\\"a\\": 1}"')]),
    "text_after_the_calls_dropped": ('{"name": "f", "parameters": {}}\nI called f.', None, [("f", "{}")]),
    "broken_after_a_call_dropped": ('{"name": "f", "parameters": {}}; {"name": "g", "param', None, [("f", "{}")]),
    "text_before_the_json": ('Sure: {"name": "f", "parameters": {}}', 'Sure: {"name": "f", "parameters": {}}', []),
    "space_before_the_json": (' {"name": "f", "parameters": {}}', ' {"name": "f", "parameters": {}}', []),
    "json_that_is_no_call": ('{"answer": 42}', '{"answer": 42}', []),
    "name_not_a_string": ('{"name": ["f"], "parameters": {}}', '{"name": ["f"], "parameters": {}}', []),
    "cut_off": ('{"name": "f", "parameters": {"a": 1}', '{"name": "f", "parameters": {"a": 1}', []),
    "not_json": ("{oops} and more", "{oops} and more", []),
    "python_tag_with_code": ('<|python_tag|>brave_search.call(query="x")', '<|python_tag|>brave_search.call(query="x")',
                             []),
    "partial_python_tag": ("<|python", "<|python", []),
}

MISTRAL = {
    "no_call": ("This is a test", "This is a test", []),
    "array": ('[TOOL_CALLS][{"name": "add", "arguments":{"a": 3.5, "b": 4}}]', None, [("add", '{"a": 3.5, "b": 4}')]),
    "array_several": ('[TOOL_CALLS] [{"name": "add", "arguments": {"a": 3.5, "b": 4}}, {"name": "get_current_weather", '
                      '"arguments":{"city": "San Francisco", "state": "CA", "unit": "celsius"}}]', None,
                      [("add", '{"a": 3.5, "b": 4}'),
                       ("get_current_weather", '{"city": "San Francisco", "state": "CA", "unit": "celsius"}')]),
    "content_before": ('Hello[TOOL_CALLS] [{"name": "add", "arguments":{"a": 1, "b": 2}}]', "Hello",
                       [("add", '{"a": 1, "b": 2}')]),
    "trailing_data_dropped": ('[TOOL_CALLS] [{"name": "get_current_weather", "arguments":{"city": "Dallas"}}]\nextra '
                              "trailing data", None, [("get_current_weather", '{"city": "Dallas"}')]),
    "arguments_before_name": ('[TOOL_CALLS] [{"arguments":{"name": "John Doe"}, "name": "get_age"}]', None,
                              [("get_age", '{"name": "John Doe"}')]),
    "no_arguments_are_empty": ('[TOOL_CALLS][{"name": "now"}]', None, [("now", "{}")]),
    "array_unicode": (
        '[TOOL_CALLS][{"name": "translate", "arguments": {"text": "Grüße", "emoji": "\\ud83d\\ude00"}}]', None,
        [("translate", '{"text": "Grüße", "emoji": "😀"}')]),
    "name_form": ('[TOOL_CALLS]add_this_and_that{"a": 3.5, "b": 4}', None,
                  [("add_this_and_that", '{"a": 3.5, "b": 4}')]),
    "name_form_several": ('[TOOL_CALLS]add{"a": 3.5, "b": 4}[TOOL_CALLS]multiply{"a": 3, "b": 6}', None,
                          [("add", '{"a": 3.5, "b": 4}'), ("multiply", '{"a": 3, "b": 6}')]),
    "name_form_args_token": ('[TOOL_CALLS]get_weather[ARGS]{"city": "Zürich"}', None,
                             [("get_weather", '{"city": "Zürich"}')]),
    "name_form_arguments_as_written": ('[TOOL_CALLS]f{"a":1,  "b":"\\u00e9"}', None,
                                       [("f", '{"a":1,  "b":"\\u00e9"}')]),
    "name_form_broken_arguments_still_a_call": ('[TOOL_CALLS]f{"a": ', None, [("f", '{"a": ')]),
    "name_form_content_before": ("Let me add.[TOOL_CALLS]add{\"a\": 1}", "Let me add.", [("add", '{"a": 1}')]),
    "not_json": ("[TOOL_CALLS] not json at all", "[TOOL_CALLS] not json at all", []),
    "array_cut_off": ('[TOOL_CALLS] [{"name": "add", "arguments": {"a": 1}',
                      '[TOOL_CALLS] [{"name": "add", "arguments": {"a": 1}', []),
    "array_item_without_name": ('[TOOL_CALLS][{"arguments": {}}]', '[TOOL_CALLS][{"arguments": {}}]', []),
    "empty_array": ("[TOOL_CALLS][]", "[TOOL_CALLS][]", []),
    "marker_alone": ("Hi[TOOL_CALLS]  ", "Hi[TOOL_CALLS]  ", []),
    "partial_marker": ("x [TOOL_CALL", "x [TOOL_CALL", []),
    "broken_then_name_form": ('[TOOL_CALLS] oops [TOOL_CALLS]f{"a": 1}', "[TOOL_CALLS] oops ", [("f", '{"a": 1}')]),
}

CASES = [pytest.param(parser, *case, id=f"{parser}-{name}")
         for parser, cases in (("hermes", HERMES), ("llama3_json", LLAMA), ("mistral", MISTRAL))
         for name, case in cases.items()]


def stream(parser_name: str, pieces: list[str]) -> tuple[str, list[tuple[str, str, str]]]:
    """The pieces through one parser as a stream, then finish(): (content, [(id, name, arguments)]);
    checks that each call opens with its id, type and name and then only adds arguments."""
    parser = TOOL_PARSERS[parser_name](TOOLS)
    content, calls = "", []
    for got_content, deltas in [*(parser.feed(piece) for piece in pieces), parser.finish()]:
        content += got_content
        for delta in deltas:
            if "id" in delta:
                function = delta["function"]
                assert delta == {"index": len(calls), "id": delta["id"], "type": "function",
                                 "function": {"name": function["name"], "arguments": ""}}
                calls.append((delta["id"], function["name"], ""))
            else:
                assert delta["index"] == len(calls) - 1 and list(delta["function"]) == ["arguments"]
                fragment = delta["function"]["arguments"]
                assert set(delta) == {"index", "function"} and fragment
                call_id, name, arguments = calls[-1]
                calls[-1] = (call_id, name, arguments + fragment)
    return content, calls


@pytest.mark.parametrize("parser_name, text, content, calls", CASES)
def test_extract_gives_what_vllm_gives(parser_name, text, content, calls):
    got_content, got_calls = TOOL_PARSERS[parser_name](TOOLS).extract(text)
    assert got_content == content
    assert [(call.name, call.arguments) for call in got_calls] == calls


@pytest.mark.parametrize("parser_name, text, content, calls", CASES)
def test_a_stream_cut_anywhere_gives_what_extract_gives(parser_name, text, content, calls):
    got_content, got_calls = TOOL_PARSERS[parser_name](TOOLS).extract(text)
    expected = (got_content or "", [(call.name, call.arguments) for call in got_calls])
    for pieces in [*([text[:cut], text[cut:]] for cut in range(len(text) + 1)), list(text)]:
        streamed_content, streamed_calls = stream(parser_name, pieces)
        assert (streamed_content, [(name, arguments) for _, name, arguments in streamed_calls]) == expected, pieces


@pytest.mark.parametrize("parser_name, text, id_pattern", [
    ("hermes", f"<tool_call>{WEATHER}</tool_call><tool_call>{WEATHER}</tool_call>", r"chatcmpl-tool-[0-9a-f]{32}"),
    ("llama3_json", '{"name": "f", "parameters": {}}; {"name": "f", "parameters": {}}', r"chatcmpl-tool-[0-9a-f]{32}"),
    ("mistral", '[TOOL_CALLS][{"name": "f"}, {"name": "f"}]', r"[A-Za-z0-9]{9}"),  # mistral_common's shape
])
def test_call_ids_have_vllms_shape_and_differ(parser_name, text, id_pattern):
    _, calls = TOOL_PARSERS[parser_name](None).extract(text)
    _, streamed = stream(parser_name, [text])
    ids = [call.id for call in calls] + [call_id for call_id, _, _ in streamed]
    assert len(ids) == 4 == len(set(ids))
    assert all(re.fullmatch(id_pattern, call_id) for call_id in ids)


def test_a_call_as_openai_gives_it():
    call = ToolCall("get_weather", WEATHER_ARGS, "chatcmpl-tool-1")
    assert call.as_openai() == {"id": "chatcmpl-tool-1", "type": "function",
                                "function": {"name": "get_weather", "arguments": WEATHER_ARGS}}


def test_the_parsers_by_vllms_names():
    assert set(TOOL_PARSERS) == {"hermes", "llama3_json", "mistral"}


def test_what_may_begin_a_tag_is_held_only_until_it_cannot():
    parser = TOOL_PARSERS["hermes"](None)
    assert parser.feed("Hello <tool") == ("Hello ", [])
    assert parser.feed("s") == ("<tools", [])
    assert parser.feed(" [TOOL_CALLS") == (" [TOOL_CALLS", [])  # another format's marker is text here
    mistral = TOOL_PARSERS["mistral"](None)
    assert mistral.feed("Hi [TOOL_") == ("Hi ", [])
    assert mistral.finish() == ("[TOOL_", [])


def test_a_block_that_cannot_parse_goes_out_as_content_before_its_end_tag():
    parser = TOOL_PARSERS["hermes"](None)
    assert parser.feed("<tool_call>\n") == ("", [])
    assert parser.feed("I think") == ("<tool_call>\nI think", [])
    assert parser.feed(" so</tool") == (" so", [])
    assert parser.feed("_call> ok") == ("</tool_call> ok", [])
    not_an_object = TOOL_PARSERS["hermes"](None)
    assert not_an_object.feed('<tool_call> ["f"') == ('<tool_call> ["f"', [])


def test_an_output_opening_like_json_is_released_once_it_cannot_be_json():
    parser = TOOL_PARSERS["llama3_json"](None)
    assert parser.feed('{"name"') == ("", [])
    assert parser.feed(" is") == ('{"name" is', [])


def test_a_call_goes_out_as_its_json_closes():
    parser = TOOL_PARSERS["llama3_json"](None)
    assert parser.feed('{"name": "f", "parameters": {"a": 1}') == ("", [])
    _, deltas = parser.feed("}")
    assert [delta["function"] for delta in deltas] == [{"name": "f", "arguments": ""}, {"arguments": '{"a": 1}'}]
    hermes = TOOL_PARSERS["hermes"](None)
    assert hermes.feed(f"<tool_call>{WEATHER}") == ("", [])  # text may follow the JSON and break the block
    assert len(hermes.feed("</tool_call>")[1]) == 2


def test_mistral_name_form_streams_its_arguments_as_they_come():
    parser = TOOL_PARSERS["mistral"](None)
    _, deltas = parser.feed('[TOOL_CALLS]get_weather[ARGS]{"city": ')
    assert [delta["function"] for delta in deltas] == [{"name": "get_weather", "arguments": ""},
                                                      {"arguments": '{"city": '}]
    assert parser.feed('"Paris"}[TOOL') == ("", [{"index": 0, "function": {"arguments": '"Paris"}'}}])
    _, deltas = parser.feed('_CALLS]now{}')
    assert [(delta["index"], delta["function"]) for delta in deltas] == [(1, {"name": "now", "arguments": ""}),
                                                                         (1, {"arguments": "{}"})]


def test_finish_closes_a_call_whose_end_tag_never_came():
    parser = TOOL_PARSERS["hermes"](None)
    assert parser.feed('<tool_call>\n{"name": "f", "arguments": {}}\n') == ("", [])
    _, deltas = parser.finish()
    assert [delta["function"] for delta in deltas] == [{"name": "f", "arguments": ""}, {"arguments": "{}"}]


def test_leading_whitespace_waits_to_know_whether_a_call_follows():
    parser = TOOL_PARSERS["hermes"](None)
    assert parser.feed("\n\n") == ("", [])
    assert parser.finish() == ("\n\n", [])  # no call: the text, whitespace and all
    assert TOOL_PARSERS["hermes"](None).extract("\n\n") == ("\n\n", [])
    parser = TOOL_PARSERS["hermes"](None)
    assert parser.feed("\n") == ("", [])
    assert parser.feed("Hi") == ("\nHi", [])


def test_extract_leaves_a_stream_in_progress_alone():
    parser = TOOL_PARSERS["hermes"](None)
    parser.feed("Hello <tool_")
    assert parser.extract(f"<tool_call>{WEATHER}</tool_call>")[0] is None
    assert parser.feed("call>")[0] == ""
    assert parser.feed(f"{WEATHER}</tool_call>")[1][0]["function"]["name"] == "get_weather"


# The scanner that tells a call's JSON whole, open or broken, against json's own parse of it

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=4), children, max_size=3),
    max_leaves=10)
CONTAINERS = st.lists(JSON_VALUES, max_size=3) | st.dictionaries(st.text(max_size=4), JSON_VALUES, max_size=3)


def scan(*pieces: str) -> _JsonScanner:
    scanner = _JsonScanner()
    for piece in pieces:
        scanner.feed(piece)
    return scanner


@given(value=CONTAINERS, indent=st.sampled_from([None, 0, 2]), ensure_ascii=st.booleans(), cut=st.integers(0, 10**6))
def test_no_beginning_of_json_is_taken_for_broken(value, indent, ensure_ascii, cut):
    text = json.dumps(value, indent=indent, ensure_ascii=ensure_ascii)
    for end in range(len(text)):
        assert scan(text[:end]).status is _OPEN
    scanner = scan(text[:cut % len(text)], text[cut % len(text):] + " tail")
    assert scanner.status is _COMPLETE


@given(value=CONTAINERS, position=st.integers(0, 10**6), cut=st.integers(0, 10**6),
       insert=st.text(alphabet='{}[]",:\\ 0123eE.-+tfnNIu\x01ab', min_size=1, max_size=3))
def test_the_scanner_ends_a_value_where_json_ends_it(value, position, cut, insert):
    text = json.dumps(value)
    position %= len(text) + 1
    text = text[:position] + insert + text[position:]
    if not text.startswith(("{", "[")):
        return
    cut %= len(text) + 1
    scanner = scan(text[:cut], text[cut:])
    try:
        _, end = json.JSONDecoder().raw_decode(text)
    except ValueError:
        assert scanner.status in (_OPEN, _BROKEN)
    else:
        assert scanner.status is _COMPLETE
        assert (cut + scanner.end if cut < end else scanner.end) == end  # end: in the piece that completed it
        assert scan(text[:end]).status is _COMPLETE



@pytest.mark.parametrize("text, status", [
    ("[-0, 1e5, 2E-3, 0.5e+1, 0e1]", _COMPLETE), ("[-Infinity, Infinity, NaN, true, false, null]", _COMPLETE),
    ('["\\u00e9 \\ud83d\\ude00 \\/ \\b\\f\\n\\r\\t \\" \\\\"]', _COMPLETE),
    ('{"k": "v", "k": 2}', _COMPLETE), ("[ \t\n\r1 ]", _COMPLETE), ("[[]]]", _COMPLETE), ("{} ", _COMPLETE),
    ("[1]x", _COMPLETE),
    ("[01]", _BROKEN), ("[1.]", _BROKEN), ("[1.e3]", _BROKEN), ("[-]", _BROKEN), ("[1e]", _BROKEN), ("[+1]", _BROKEN),
    ("[1-2]", _BROKEN),
    ("[-NaN]", _BROKEN), ("[infinity]", _BROKEN), ("[tru]", _BROKEN), ('["\x01"]', _BROKEN), ('["\\u12G4"]', _BROKEN),
    ('["\\q"]', _BROKEN), ("['a']", _BROKEN), ('{"a" 1}', _BROKEN), ("{1: 2}", _BROKEN), ("[1,]", _BROKEN),
    ('{"a": 1,}', _BROKEN), ('{"a": [}', _BROKEN), ("[1 2]", _BROKEN), ('{"a": 1 "b": 2}', _BROKEN),
    ("[\u00a01]", _BROKEN),  # json skips only space, tab, newline and return
    ("[true", _OPEN), ('["\\', _OPEN), ('["\\u00', _OPEN), ("[1", _OPEN), ('{"a": -', _OPEN), ('{"a": 1.5e', _OPEN),
    ('{"a"', _OPEN), ("[-Inf", _OPEN),
])
def test_the_scanner_on_jsons_edges(text, status):
    scanner = scan(text)
    assert scanner.status is status
    if status is _COMPLETE:
        assert scanner.end == json.JSONDecoder().raw_decode(text)[1]
    else:
        with pytest.raises(ValueError):
            json.JSONDecoder().raw_decode(text)
