"""One chat choice's output text as a message: the reasoning span (--reasoning-parser), then, in
what follows it, the tool calls (--tool-call-parser with tool_choice "auto", or the grammar of a
forced choice) and the content; whole for a response body, piece by piece for a stream, in the
shapes OpenAI (and vLLM, for `reasoning_content`) give them.
"""
from gateway_svc.chat_parsing import ChatParsing
from gateway_svc.ids import new_id
from gateway_svc.reasoning_parsers import REASONING_PARSERS
from gateway_svc.tool_choice import ToolChoice
from gateway_svc.tool_parsers import TOOL_PARSERS


class ChoiceOutput:
    """The parsers of one choice (a stream's keep state between pieces)."""

    def __init__(self, parsing: ChatParsing, tool_choice: ToolChoice, chat_template_kwargs: dict | None = None):
        self._reasoning = (REASONING_PARSERS[parsing.reasoning_parser](chat_template_kwargs=chat_template_kwargs)
                           if parsing.reasoning_parser else None)
        self._tool_choice = tool_choice
        self._tools = (TOOL_PARSERS[parsing.tool_call_parser](tool_choice.tools)
                       if tool_choice.mode == "auto" else None)
        self._forced_text = ""  # a `required` output, parsed whole at the end
        self._named_call_id: str | None = None  # a named call's, once its first piece went out
        self.called = False  # a tool call was made: finish_reason "tool_calls" where OpenAI gives it

    def message(self, text: str) -> dict:
        """A whole output as a response's message."""
        reasoning, rest = self._reasoning.extract(text) if self._reasoning else (None, text)
        content, calls = rest, []
        if self._tool_choice.forced:
            content, calls = None, self._tool_choice.forced_calls(rest or "")
        elif self._tools is not None:
            content, calls = self._tools.extract(rest or "")
        message = {"role": "assistant", "content": content}
        if self._reasoning is not None:
            message["reasoning_content"] = reasoning
        if calls:
            self.called = True
            message["tool_calls"] = [call.as_openai() for call in calls]
        return message

    def delta(self, text: str, final: bool) -> dict:
        """The next piece of a stream as a chunk's delta fields (none when it holds nothing yet);
        final: the last piece, after which whatever a parser held back goes out."""
        reasoning, rest = self._reasoning.feed(text) if self._reasoning else ("", text)
        if final and self._reasoning is not None:
            held_reasoning, held_rest = self._reasoning.finish()
            reasoning, rest = reasoning + held_reasoning, rest + held_rest
        content, calls = self._after_reasoning(rest, final)
        delta = {}
        if reasoning:
            delta["reasoning_content"] = reasoning
        if content:
            delta["content"] = content
        if calls:
            self.called = True
            delta["tool_calls"] = calls
        return delta

    def finish_reason(self, reason: str | None) -> str | None:
        """OpenAI's reason: "tool_calls" when calls ended the output, as vLLM reports it for
        "auto" and "required"."""
        if reason == "stop" and self.called and self._tool_choice.mode in ("auto", "required"):
            return "tool_calls"
        return reason

    def _after_reasoning(self, text: str, final: bool) -> tuple[str, list[dict]]:
        mode = self._tool_choice.mode
        if mode == "named":
            if not text:
                return "", []
            call = {"index": 0, "function": {"arguments": text}}
            if self._named_call_id is None:
                self._named_call_id = new_id("chatcmpl-tool-")
                call = {"index": 0, "id": self._named_call_id, "type": "function",
                        "function": {"name": self._tool_choice.name, "arguments": text}}
            return "", [call]
        if mode == "required":
            self._forced_text += text
            if not final:
                return "", []
            return "", [{"index": i, **call.as_openai()}
                        for i, call in enumerate(self._tool_choice.forced_calls(self._forced_text))]
        if self._tools is None:
            return text, []
        content, calls = self._tools.feed(text)
        if final:
            held_content, held_calls = self._tools.finish()
            content, calls = content + held_content, calls + held_calls
        return content, calls
