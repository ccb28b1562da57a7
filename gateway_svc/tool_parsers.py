"""Tool calls in a chat completion's output text, as vLLM's `--tool-call-parser hermes | llama3_json |
mistral` find them: `extract` for a whole output, `feed` / `finish` for a stream.

Both paths run one state machine (`extract` feeds it the whole text at once), so a stream gives the
calls and the content the whole text gives, however the text was cut into pieces. What the two
share, as vLLM's non-streaming parsers give it:
- The content is the text before the first call; what follows it and is no call is dropped. It is
  None when that text is empty or only whitespace; when no call is found the whole text is content.
- Broken JSON in a call makes it no call: its text is content (or dropped, after a call). Where
  vLLM's whole-output parse meets one broken call it gives the whole text as content; here the calls
  that parsed stay calls, as a stream has sent them by then.
- Arguments are `json.dumps(..., ensure_ascii=False)` of the parsed value (mistral's newer
  `name{...}` form excepted: vLLM passes those through as the model wrote them).

A stream sends a call once its text has parsed (the id and name, then the arguments in one piece):
vLLM streams partial JSON, but a call whose JSON breaks later (or is cut off by max_tokens) is
content for vLLM's whole-output parse, and a call already sent cannot be taken back. Mistral's
`name{...}` form, whose arguments are not parsed, streams them as they come. Text that may still
turn into a call (a partial "<tool_call", an output opening with "{") is held back until it is told,
and so is leading whitespace, until it is told whether a call follows it.
"""
import json
import re
import secrets
import string
from abc import ABC, abstractmethod
from dataclasses import dataclass

from gateway_svc.ids import new_id


@dataclass
class ToolCall:
    name: str
    arguments: str  # JSON text
    id: str

    def as_openai(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


class ToolParser(ABC):
    """One choice's parser: a stream keeps its state between pieces."""

    def __init__(self, tools: list[dict] | None):
        self.tools = tools  # the request's `tools`, as vLLM's parsers take them; these three formats read none
        self._pending = ""  # text read but not yet given out as content, a call or dropped
        self._calls: list[ToolCall] = []
        self._content_out: list[str] = []
        self._deltas_out: list[dict] = []
        self._leading_whitespace = ""  # content so far while it is only whitespace: dropped if a call follows
        self._content_begun = False

    def extract(self, text: str) -> tuple[str | None, list[ToolCall]]:
        """A whole model output -> (the content, None when empty or whitespace; the calls).
        No call found: (text, [])."""
        parser = type(self)(self.tools)  # a fresh machine: this one may be in the middle of a stream
        content = parser.feed(text)[0] + parser.finish()[0]
        if not parser._calls:
            return text, []
        return content or None, parser._calls

    def feed(self, delta_text: str) -> tuple[str, list[dict]]:
        """The next piece of model text -> (content to send now, tool-call deltas in OpenAI's streaming
        shape: {"index", "id", "type", "function": {"name", "arguments": ""}} opens call i, then
        {"index", "function": {"arguments": fragment}} pieces)."""
        self._pending += delta_text
        self._advance(final=False)
        return self._take()

    def finish(self) -> tuple[str, list[dict]]:
        """The end of the stream: what was held back goes out, as content or as a last call."""
        self._advance(final=True)
        if not self._calls:  # whitespace then no call: the whole text is the content
            self._content_out.append(self._leading_whitespace)
        return self._take()

    @abstractmethod
    def _advance(self, final: bool) -> None:
        """Read self._pending as far as it can be told what it is, giving it out through _content,
        _call and _arguments; final: the text ends here."""

    def _new_call_id(self) -> str:
        return new_id("chatcmpl-tool-")

    def _take(self) -> tuple[str, list[dict]]:
        content, deltas = "".join(self._content_out), self._deltas_out
        self._content_out, self._deltas_out = [], []
        return content, deltas

    def _content(self, text: str) -> None:
        if self._calls or not text:  # after the first call, vLLM keeps no content
            return
        if not self._content_begun:
            if text.isspace():
                self._leading_whitespace += text
                return
            self._content_begun = True
            text, self._leading_whitespace = self._leading_whitespace + text, ""
        self._content_out.append(text)

    def _call(self, name: str, arguments: str = "") -> None:
        call = ToolCall(name, "", self._new_call_id())
        self._deltas_out.append({"index": len(self._calls), "id": call.id, "type": "function",
                                 "function": {"name": name, "arguments": ""}})
        self._calls.append(call)
        self._arguments(arguments)

    def _arguments(self, fragment: str) -> None:
        if fragment:
            self._calls[-1].arguments += fragment
            self._deltas_out.append({"index": len(self._calls) - 1, "function": {"arguments": fragment}})

    def _json_calls(self, value: "_JsonInText", to_calls, final: bool) -> bool | None:
        """Reads the JSON value in self._pending; once it is whole or can be none, whether to_calls (its text ->
        [(name, arguments)], or None) found calls in it, given out with its text taken from self._pending.
        None while it is open."""
        text = value.read(self._pending, len(self._pending), final)
        if text is None:
            return None
        calls = to_calls(text)
        if calls is None:
            return False
        for call in calls:
            self._call(*call)
        self._pending = self._pending[value.start + len(text):]
        return True


class HermesToolParser(ToolParser):
    """Hermes / Qwen2.5 / Qwen3: `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, as many
    as the model makes; the last one may lack its end tag (vLLM reads it to the end of the text)."""

    _OPEN, _CLOSE = "<tool_call>", "</tool_call>"

    def __init__(self, tools: list[dict] | None):
        super().__init__(tools)
        self._state = "text"  # "text"; "call": in a block, self._pending its body; "broken": in a block that is none
        self._close_searched = 0  # how far the body holds no end tag
        self._body = _JsonBody()

    def _advance(self, final: bool) -> None:
        while True:
            if self._state == "text":
                start = self._pending.find(self._OPEN)
                if start == -1:
                    self._content(self._take_pending(_held_marker_length(self._pending, self._OPEN, final)))
                    return
                self._content(self._pending[:start])
                self._pending = self._pending[start + len(self._OPEN):]
                self._state, self._close_searched, self._body = "call", 0, _JsonBody()
                continue
            end = self._pending.find(self._CLOSE, self._close_searched)
            if end != -1:
                body, self._pending = self._pending[:end], self._pending[end + len(self._CLOSE):]
                if self._state == "call":
                    self._settle(body, self._CLOSE)
                else:
                    self._content(body + self._CLOSE)
                self._state = "text"
                continue
            if final:
                if self._state == "call":
                    self._settle(self._pending, "")
                else:
                    self._content(self._pending)
                self._pending = ""
                return
            held = _held_marker_length(self._pending, self._CLOSE, final)
            self._close_searched = len(self._pending) - held
            if self._state == "call" and self._body.broken_by(self._pending, self._close_searched):
                # vLLM's json.loads of the block fails whatever follows: its text is content from here on
                self._state = "broken"
                self._content(self._OPEN)
            if self._state == "broken":
                self._content(self._take_pending(held))
                self._close_searched = 0
            return

    def _take_pending(self, held: int) -> str:
        """The pending text but its last `held` characters, which stay pending."""
        cut = len(self._pending) - held
        taken, self._pending = self._pending[:cut], self._pending[cut:]
        return taken

    def _settle(self, body: str, close: str) -> None:
        call = _hermes_call(body)
        if call is None:
            self._content(self._OPEN + body + close)
        else:
            self._call(*call)


def _hermes_call(body: str) -> tuple[str, str] | None:
    """(name, arguments) of a block's JSON, or None where vLLM's hermes parser fails on it."""
    obj = _loads(body)
    if not isinstance(obj, dict) or not _is_name(obj.get("name")) or "arguments" not in obj:
        return None
    arguments = obj["arguments"]
    if isinstance(arguments, str):  # arguments sent as a JSON string: vLLM parses it
        arguments = _loads(arguments)
        if arguments is _NOT_JSON:
            return None
    return obj["name"], _dumps(arguments)


class Llama3JsonToolParser(ToolParser):
    """Llama 3.1 / 3.2 JSON tool calling: an output that is (after an optional `<|python_tag|>`)
    `{"name": ..., "parameters": {...}}` ("arguments" also taken), or several such objects separated by
    `;`. vLLM streams calls only from an output that opens so, and so does this parser for both paths."""

    _PYTHON_TAG = "<|python_tag|>"

    def __init__(self, tools: list[dict] | None):
        super().__init__(tools)
        # "start"; "object": self._pending from the object's "{"; "between": after a call; "text": the rest,
        # content if no call came before it (else dropped)
        self._state = "start"
        self._object = _JsonInText(0)

    def _advance(self, final: bool) -> None:
        while True:
            if self._state == "start":
                tag = len(self._PYTHON_TAG) if self._pending.startswith(self._PYTHON_TAG) else 0
                rest = self._pending[tag:]
                if not rest or (not tag and self._PYTHON_TAG.startswith(rest)):
                    if not final:
                        return  # too little to tell yet
                    self._state = "text"
                else:
                    self._state = "object" if rest.startswith("{") else "text"
                    self._object = _JsonInText(tag)
            elif self._state == "object":
                called = self._json_calls(self._object, _llama_calls, final)
                if called is None:
                    return
                self._state = "between" if called else "text"
            elif self._state == "between":
                separators = len(self._pending) - len(self._pending.lstrip(_SEPARATORS))
                if separators == len(self._pending):
                    self._pending = ""
                    return
                self._pending = self._pending[separators:]
                self._state = "object" if self._pending.startswith("{") else "text"
                self._object = _JsonInText(0)
            else:
                self._content(self._pending)
                self._pending = ""
                return


_SEPARATORS = "; \t\n\r"  # between Llama's calls: "; " in its template, any run of these read


def _llama_calls(text: str) -> list[tuple[str, str]] | None:
    obj = _loads(text)
    if not isinstance(obj, dict) or not _is_name(obj.get("name")):
        return None
    for key in ("arguments", "parameters"):  # vLLM takes "arguments" first
        if key in obj:
            return [(obj["name"], _dumps(obj[key]))]
    return None


class MistralToolParser(ToolParser):
    """Mistral: content, then `[TOOL_CALLS]` and a JSON array `[{"name": ..., "arguments": {...}}, ...]`
    (Mistral 7B v0.3, Nemo), or `[TOOL_CALLS]name{...}` (`name[ARGS]{...}` where [ARGS] is kept in the
    text), one per call, for tokenizers v11 on (Mistral Small 3.1 on). vLLM picks the form by the
    tokenizer's version; this parser by the text: an array when "[" follows the marker. The newer form's
    arguments are the text up to the next marker, unparsed, as vLLM gives them (vLLM keeps a call with
    broken arguments a call, so that the model sees what it tried), and stream as they come."""

    _MARKER = "[TOOL_CALLS]"
    _ID_ALPHABET = string.ascii_letters + string.digits

    def __init__(self, tools: list[dict] | None):
        super().__init__(tools)
        # "text"; after a marker, self._pending from it: "marker", "array", "name"; "arguments": a call's,
        # streaming; "broken": text after a marker that is no call, content up to the next marker
        self._state = "text"
        self._array = _JsonInText(0)

    def _new_call_id(self) -> str:
        # Mistral's ids are 9 letters and digits (mistral_common checks them when they come back)
        return "".join(secrets.choice(self._ID_ALPHABET) for _ in range(9))

    def _advance(self, final: bool) -> None:
        marker = self._MARKER
        while True:
            if self._state in ("text", "arguments", "broken"):
                found = self._pending.find(marker)
                cut = found if found != -1 else len(self._pending) - _held_marker_length(self._pending, marker, final)
                if self._state == "arguments":
                    self._arguments(self._pending[:cut])
                else:
                    self._content(self._pending[:cut])
                self._pending = self._pending[cut:]
                if found == -1:
                    return
                self._state = "marker"
            elif self._state == "marker":
                after = self._pending[len(marker):]
                opening = after.lstrip()
                if not opening:
                    if not final:
                        return
                    self._break()
                elif opening.startswith("["):
                    self._state = "array"
                    self._array = _JsonInText(len(self._pending) - len(opening))
                else:
                    self._state = "name"
            elif self._state == "array":
                called = self._json_calls(self._array, _mistral_array_calls, final)
                if called is None:
                    return
                if called:
                    self._state = "text"  # where what follows the array is dropped, as vLLM's raw_decode drops it
                else:
                    self._break()
            else:  # "name"
                brace = self._pending.find("{")
                next_marker = self._pending.find(marker, len(marker))
                if brace == -1 or -1 < next_marker < brace:
                    if next_marker == -1 and not final:
                        return  # the name goes on
                    self._break()
                    continue
                name = self._pending[len(marker):brace].replace("[ARGS]", "").strip()
                if not name:
                    self._break()
                    continue
                self._call(name)
                self._pending, self._state = self._pending[brace:], "arguments"

    def _break(self) -> None:
        """The text from this marker is no call: content up to the next marker."""
        self._content(self._MARKER)
        self._pending, self._state = self._pending[len(self._MARKER):], "broken"


def _mistral_array_calls(text: str) -> list[tuple[str, str]] | None:
    items = _loads(text)
    if not isinstance(items, list) or not items:
        return None
    calls = []
    for item in items:
        if not isinstance(item, dict) or not _is_name(item.get("name")):
            return None
        calls.append((item["name"], _dumps(item.get("arguments", {}))))  # vLLM: no arguments are {}
    return calls


TOOL_PARSERS: dict[str, type[ToolParser]] = {
    "hermes": HermesToolParser,
    "llama3_json": Llama3JsonToolParser,
    "mistral": MistralToolParser,
}


_NOT_JSON = object()


def _loads(text: str):
    """The JSON value of text, or _NOT_JSON (json's errors, too-long integers and too-deep nesting alike)."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return _NOT_JSON


def _dumps(value) -> str:
    return json.dumps(value, ensure_ascii=False)


def _is_name(name) -> bool:
    """A call's name: a non-empty string (vLLM's FunctionCall takes no other type; an empty one names nothing)."""
    return isinstance(name, str) and name != ""


def _held_marker_length(text: str, marker: str, final: bool) -> int:
    """How many characters at the end of text may begin marker, and so wait for the next piece (none at the end)."""
    if final:
        return 0
    return next((n for n in range(min(len(marker) - 1, len(text)), 0, -1) if text.endswith(marker[:n])), 0)


_OPEN, _COMPLETE, _BROKEN = "open", "complete", "broken"
_WHITESPACE = " \t\n\r"  # JSON's, which is all json.loads skips
_DIGITS = "0123456789"
_HEX_DIGITS = "0123456789abcdefABCDEF"
_LITERALS = {"t": "true", "f": "false", "n": "null", "N": "NaN", "I": "Infinity"}  # json.loads takes NaN, Infinity
_NUMBER_END_STATES = ("zero", "int", "frac", "exp")  # a number may end after these
_PLAIN_STRING_RUN = re.compile(r'[^"\\\x00-\x1f]*')  # string characters taken as they are (no ", \\ nor control)


class _JsonScanner:
    """Reads a JSON object or array as its characters come, by the grammar json.loads takes, to tell as
    soon as it can that the value is whole (where it ends) or that no text to come can make it JSON:
    text that will be no call goes out as content without waiting for the end of the output."""

    def __init__(self):
        self.status = _OPEN
        self.end = 0  # once complete: where the value ends in the piece that completed it
        self._stack: list[str] = []  # the open "{" and "["
        self._state = "value"
        self._key = False  # the string being read is an object's key
        self._literal_left = ""  # the rest of a literal being read
        self._hex_left = 0  # a \u escape's hex digits still to come

    def feed(self, text: str) -> None:
        if self.status is not _OPEN:
            return
        i = 0
        while i < len(text) and self.status is _OPEN:
            if self._state == "string":
                i = _PLAIN_STRING_RUN.match(text, i).end()
                if i == len(text):
                    break
            if self._step(text[i]):
                i += 1
        self.end = i

    def _step(self, c: str) -> bool:
        """Reads c; False when c ends a number and is to be read again as what follows it."""
        state = self._state
        if state in ("value", "value_or_close", "key", "key_or_close", "colon", "after_value") and c in _WHITESPACE:
            return True
        if state in ("value", "value_or_close"):
            if c == "]" and state == "value_or_close":
                return self._close()
            return self._start_value(c)
        if state in ("key", "key_or_close"):
            if c == "}" and state == "key_or_close":
                return self._close()
            if c == '"':
                self._state, self._key = "string", True
                return True
            return self._fail()
        if state == "colon":
            return self._to("value") if c == ":" else self._fail()
        if state == "after_value":
            top = self._stack[-1]
            if c == ",":
                return self._to("key" if top == "{" else "value")
            return self._close() if c == ("}" if top == "{" else "]") else self._fail()
        if state == "string":  # the characters that end a run of plain ones
            if c == '"':
                return self._to("colon" if self._key else "after_value")
            return self._to("escape") if c == "\\" else self._fail()  # a control character json.loads refuses
        if state == "escape":
            if c == "u":
                self._hex_left = 4
                return self._to("unicode")
            return self._to("string") if c in '"\\/bfnrt' else self._fail()
        if state == "unicode":
            if c not in _HEX_DIGITS:
                return self._fail()
            self._hex_left -= 1
            return self._to("unicode" if self._hex_left else "string")
        if state == "literal":
            if c != self._literal_left[0]:
                return self._fail()
            self._literal_left = self._literal_left[1:]
            return self._to("literal" if self._literal_left else "after_value")
        return self._number(c)

    def _start_value(self, c: str) -> bool:
        if c in "{[":
            self._stack.append(c)
            return self._to("key_or_close" if c == "{" else "value_or_close")
        if c == '"':
            self._key = False
            return self._to("string")
        if c in _LITERALS:
            self._literal_left = _LITERALS[c][1:]
            return self._to("literal")
        if c == "-":
            return self._to("minus")
        if c in _DIGITS:
            return self._to("zero" if c == "0" else "int")
        return self._fail()

    def _number(self, c: str) -> bool:
        """json's numbers: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][-+]?[0-9]+)?, and -Infinity."""
        state = self._state
        if state == "minus":
            if c == "I":
                self._literal_left = "nfinity"
                return self._to("literal")
            return self._to("zero" if c == "0" else "int") if c in _DIGITS else self._fail()
        if c in _DIGITS and state != "zero":
            return self._to({"frac_start": "frac", "exp_start": "exp", "exp_sign": "exp"}.get(state, state))
        if c == "." and state in ("zero", "int"):
            return self._to("frac_start")
        if c in "eE" and state in ("zero", "int", "frac"):
            return self._to("exp_start")
        if c in "+-" and state == "exp_start":
            return self._to("exp_sign")
        if state in _NUMBER_END_STATES:
            self._state = "after_value"
            return False
        return self._fail()

    def _close(self) -> bool:
        self._stack.pop()
        if not self._stack:
            self.status = _COMPLETE
        return self._to("after_value")

    def _to(self, state: str) -> bool:
        self._state = state
        return True

    def _fail(self) -> bool:
        self.status = _BROKEN
        return True


class _JsonInText:
    """A JSON object or array that begins at `start` in a text that grows, read as it grows."""

    def __init__(self, start: int):
        self.start = start
        self._read = start
        self._scanner = _JsonScanner()

    def read(self, text: str, end: int, final: bool) -> str | None:
        """text[:end]: the text so far. The value's text once whole; "" once no text to come can make it
        JSON (or the text ended with it open); None while it is open."""
        read, self._read = self._read, end
        self._scanner.feed(text[read:end])
        if self._scanner.status is _COMPLETE:
            return text[self.start:read + self._scanner.end]
        return "" if self._scanner.status is _BROKEN or final else None


class _JsonBody:
    """Whether a hermes block's body read so far can still be what vLLM parses: JSON whitespace, one object,
    whitespace."""

    def __init__(self):
        self._read = 0
        self._object: _JsonInText | None = None
        self._value: str | None = None

    def broken_by(self, text: str, end: int) -> bool:
        """text[:end]: the block's body so far (it grows from call to call)."""
        if self._object is None:
            start = end - len(text[self._read:end].lstrip(_WHITESPACE))
            self._read = start
            if start == end:
                return False
            if text[start] != "{":
                return True
            self._object = _JsonInText(start)
        if self._value is None:
            self._value = self._object.read(text, end, final=False)
            if not self._value:
                return self._value == ""
            self._read = self._object.start + len(self._value)
        after, self._read = text[self._read:end], end
        return after.strip(_WHITESPACE) != ""
