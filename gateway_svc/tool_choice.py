"""A chat request's `tools` and `tool_choice`, checked as vLLM checks them, and what a forced
choice makes of the output.

`none`: the tools reach the template, the output is content. `auto` (the default when tools are
given): the server's --tool-call-parser finds calls in the output, so it needs
--enable-auto-tool-choice. A named function, or `required`: a grammar built from the tools' JSON
schemas forces the output (the named function's arguments; for `required`, a JSON array of
{"name", "parameters"} objects, one or more), so the arguments always parse.
"""
import json
from dataclasses import dataclass
from typing import Any

from gateway_svc.errors import bad_request
from gateway_svc.ids import new_id
from gateway_svc.tool_parsers import ToolCall

AUTO_NEEDS_FLAGS = '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'


@dataclass(frozen=True)
class ToolChoice:
    mode: str  # "none" | "auto" | "required" | "named"
    tools: list[dict] | None = None
    name: str | None = None  # the named function's
    parallel: bool = True  # `required` may call more than one

    @property
    def forced(self) -> bool:
        return self.mode in ("required", "named")

    def structured_outputs(self) -> dict[str, Any] | None:
        """The grammar of a forced choice (structured outputs' {"json": schema}); None otherwise."""
        if self.mode == "named":
            return {"json": _parameters(self._function(self.name))}
        if self.mode != "required":
            return None
        calls = [{"type": "object", "properties": {"name": {"type": "string", "enum": [f["name"]]},
                                                     "parameters": _parameters(f)},
                  "required": ["name", "parameters"]} for f in self._functions()]
        schema = {"type": "array", "minItems": 1, "items": {"anyOf": calls}}
        if not self.parallel:
            schema["maxItems"] = 1
        return {"json": schema}

    def forced_calls(self, text: str) -> list[ToolCall]:
        """The calls a forced output holds (the grammar made it parse)."""
        if self.mode == "named":
            return [ToolCall(self.name, text, new_id("chatcmpl-tool-"))]
        try:
            items = json.loads(text)
        except json.JSONDecodeError:  # cut short by max_tokens: no complete call
            return []
        return [ToolCall(item["name"], json.dumps(item["parameters"], ensure_ascii=False), new_id("chatcmpl-tool-"))
                for item in items if isinstance(item, dict) and "name" in item and "parameters" in item]

    def _functions(self) -> list[dict]:
        return [tool["function"] for tool in self.tools or []]

    def _function(self, name: str) -> dict:
        return next(f for f in self._functions() if f["name"] == name)


def _parameters(function: dict) -> dict:
    return function.get("parameters") or {"type": "object", "properties": {}}


def tool_choice_of(tools: list | None, tool_choice: Any, parallel_tool_calls: bool | None,
                   auto_tool_choice: bool) -> ToolChoice:
    """The request's choice, or a 400 naming the field: tools must be functions with names;
    tool_choice needs tools; "auto" needs the server's flags (auto_tool_choice); a named
    function must be one of the tools."""
    _check_tools(tools)
    if tool_choice is None:
        tool_choice = "auto" if tools else "none"
    if tool_choice == "none":
        return ToolChoice("none", tools)
    if not tools:
        raise bad_request("When using `tool_choice`, `tools` must be set.", param="tool_choice")
    parallel = parallel_tool_calls is not False
    if tool_choice == "auto":
        if not auto_tool_choice:
            raise bad_request(AUTO_NEEDS_FLAGS, param="tool_choice")
        return ToolChoice("auto", tools, parallel=parallel)
    if tool_choice == "required":
        return ToolChoice("required", tools, parallel=parallel)
    name = tool_choice.get("function", {}).get("name") if isinstance(tool_choice, dict) else None
    if not isinstance(name, str) or (isinstance(tool_choice, dict) and tool_choice.get("type") != "function"):
        raise bad_request('tool_choice must be "none", "auto", "required" or {"type": "function", "function": '
                          '{"name": NAME}}', param="tool_choice")
    if name not in {tool["function"]["name"] for tool in tools}:
        raise bad_request(f"Tool '{name}' has not been passed in `tools`.", param="tool_choice")
    return ToolChoice("named", tools, name=name)


def _check_tools(tools: list | None) -> None:
    for tool in tools or []:
        is_function = isinstance(tool, dict) and tool.get("type", "function") == "function"
        function = tool.get("function") if is_function else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise bad_request('each tool must be {"type": "function", "function": {"name": ..., "parameters": '
                              '{...}}}', param="tools")
        if not isinstance(function.get("parameters", {}), (dict, type(None))):
            raise bad_request(f"tool {function['name']!r}: parameters must be a JSON schema (an object)",
                              param="tools")
