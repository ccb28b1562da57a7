"""ChatParsing: the gateway's flags for chat outputs (vLLM's names), which `stepserve serve` and
`stepserve run-batch` take too; imports nothing of the HTTP stack, so the CLI parses them on a
client-only install."""
import argparse
from dataclasses import dataclass

from gateway_svc.reasoning_parsers import REASONING_PARSERS
from gateway_svc.tool_parsers import TOOL_PARSERS


@dataclass(frozen=True)
class ChatParsing:
    """The gateway's flags for chat outputs (vLLM's names)."""
    tool_call_parser: str | None = None  # --tool-call-parser: a key of TOOL_PARSERS
    enable_auto_tool_choice: bool = False  # --enable-auto-tool-choice
    reasoning_parser: str | None = None  # --reasoning-parser: a key of REASONING_PARSERS

    def __post_init__(self):
        if self.tool_call_parser is not None and self.tool_call_parser not in TOOL_PARSERS:
            raise ValueError(f"--tool-call-parser {self.tool_call_parser!r}: one of {', '.join(TOOL_PARSERS)}")
        if self.reasoning_parser is not None and self.reasoning_parser not in REASONING_PARSERS:
            raise ValueError(f"--reasoning-parser {self.reasoning_parser!r}: one of {', '.join(REASONING_PARSERS)}")
        if self.enable_auto_tool_choice and self.tool_call_parser is None:
            raise ValueError("--enable-auto-tool-choice needs --tool-call-parser")


def add_chat_parsing_flags(p: argparse.ArgumentParser) -> None:
    """The flags of ChatParsing, for the gateway, `stepserve serve` and `stepserve run-batch`."""
    p.add_argument("--enable-auto-tool-choice", action="store_true",
                   help='tool_choice "auto": the model chooses when to call a tool (needs --tool-call-parser)')
    p.add_argument("--tool-call-parser", choices=sorted(TOOL_PARSERS), default=None,
                   help="how the model writes a tool call: hermes (Qwen's <tool_call> JSON), llama3_json, mistral")
    p.add_argument("--reasoning-parser", choices=sorted(REASONING_PARSERS), default=None,
                   help="the <think>...</think> span goes into reasoning_content, the rest into content")


def chat_parsing_of(args: argparse.Namespace) -> ChatParsing:
    return ChatParsing(args.tool_call_parser, args.enable_auto_tool_choice, args.reasoning_parser)


def chat_parsing_flags(args: argparse.Namespace) -> list[str]:
    """The flags back, for a gateway started with them (`stepserve serve`)."""
    flags = ["--enable-auto-tool-choice"] if args.enable_auto_tool_choice else []
    for flag, value in (("--tool-call-parser", args.tool_call_parser), ("--reasoning-parser", args.reasoning_parser)):
        if value is not None:
            flags += [flag, value]
    return flags
