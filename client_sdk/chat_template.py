"""Chat templates rendered the way transformers' apply_chat_template renders them.

The same Jinja environment (sandboxed, trim_blocks, lstrip_blocks, loop controls), the same
extras (tojson, raise_exception, strftime_now, the {% generation %} block) and the same
variables (messages, add_generation_prompt, tools, documents, and the special tokens' text
such as bos_token), so a model's template produces the prompt it was trained on.
"""
import functools
import json
from datetime import datetime

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from client_sdk.errors import ChatTemplateError


class _GenerationBlock(jinja2.ext.Extension):
    """{% generation %}...{% endgeneration %}: transformers marks assistant text with it (for
    its assistant-token masks); rendering keeps the body as it is."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body, lineno=lineno)


def _raise_exception(message: str):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


@functools.lru_cache(maxsize=16)
def _compile(template: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_GenerationBlock, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(template)


def flatten_content(messages: list[dict]) -> list[dict]:
    """OpenAI content parts ([{"type": "text", "text": ...}]) joined into one string, as vLLM
    does for templates that expect a string."""
    out = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            texts = []
            for part in content:
                if not isinstance(part, dict) or part.get("type") != "text":
                    raise ChatTemplateError(f"only text content parts are supported, got {part!r}")
                texts.append(part.get("text", ""))
            message = {**message, "content": "\n".join(texts)}
        out.append(message)
    return out


def _arguments_as_objects(messages: list[dict]) -> list[dict]:
    """An assistant message's tool calls with their arguments parsed (OpenAI sends them as JSON
    text; templates write them with tojson), as vLLM hands them to a template."""
    out = []
    for message in messages:
        calls = message.get("tool_calls")
        if message.get("role") == "assistant" and isinstance(calls, list):
            parsed = []
            for call in calls:
                function = call.get("function") if isinstance(call, dict) else None
                if isinstance(function, dict) and isinstance(function.get("arguments"), str):
                    try:
                        arguments = json.loads(function["arguments"]) if function["arguments"] else {}
                    except json.JSONDecodeError:
                        raise ChatTemplateError(f"tool call {function.get('name')!r}: arguments are not JSON: "
                                                f"{function['arguments'][:200]!r}") from None
                    call = {**call, "function": {**function, "arguments": arguments}}
                parsed.append(call)
            message = {**message, "tool_calls": parsed}
        out.append(message)
    return out


def render_chat(template: str, messages: list[dict], special_tokens: dict[str, str], *,
                add_generation_prompt: bool = True, tools: list | None = None, documents: list | None = None,
                **kwargs) -> str:
    """The conversation as one prompt string; ChatTemplateError when the template fails."""
    try:
        return _compile(template).render(messages=_arguments_as_objects(flatten_content(messages)), tools=tools, documents=documents,
                                         add_generation_prompt=add_generation_prompt, **special_tokens, **kwargs)
    except jinja2.exceptions.TemplateError as e:
        raise ChatTemplateError(f"the chat template failed: {e}") from None
