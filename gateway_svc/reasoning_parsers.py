"""Reasoning parsers, as vLLM's `--reasoning-parser qwen3 | deepseek_r1`: the <think>...</think>
span of a chat output goes to `reasoning_content`, the rest to `content`; from a whole output
(extract) or piece by piece as a stream arrives (feed, then finish), the pieces of a stream
joining to what extract gives for the whole.

One tag scanner serves both, so that a stream and a response body never disagree (vLLM's own
streamed and whole results differ in corner cases; here the whole result's rules decide).
What each tag does is vLLM's:
- qwen3: the grammar of the parser engine vLLM registers as "qwen3" (Qwen3Parser,
  vllm/frontend/processing/parser/qwen3.py, run as a reasoning parser). The output starts in
  reasoning: the template puts <think> in the prompt of Qwen3.5 and the 2507 thinking models,
  and older ones write it themselves. With the request's chat_template_kwargs saying
  enable_thinking=False (the template then closes an empty think block in the prompt), the
  output is all content.
- deepseek_r1: vLLM's BaseThinkingReasoningParser.extract_reasoning (vllm/reasoning/
  basic_parsers.py): reasoning from the start up to the first </think> (R1's template puts
  "<think>\n" in the prompt), without the first <think> where the model writes one.
  Two of its rules look at text a stream has not seen yet, so here they apply as far as a
  stream can apply them: vLLM drops all text before the first <think>, here only leading
  whitespace (which a stream can hold back) is dropped and other text stays reasoning, as
  vLLM's own token stream sends it; and a <think> after </think> is content, where vLLM's
  whole-output parser would restart the split at it.

Nothing is stripped: the newlines after <think> and around </think> stay in the parts, as vLLM
leaves them.
"""
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any

THINK_START = "<think>"
THINK_END = "</think>"
TOOL_CALL_START = "<tool_call>"


class ReasoningParser(ABC):
    """One choice's output: one instance per choice, since a stream's state (whether reasoning
    has ended, the text held back) lives in it."""

    # What extract gives for empty reasoning: vLLM's qwen3 engine gives None for an empty part;
    # its deepseek_r1 gives the text before </think> as it is, "" included.
    empty_reasoning: str | None = None

    def __init__(self, *, chat_template_kwargs: Mapping[str, Any] | None = None):
        """chat_template_kwargs: the request's (vLLM passes them to its parsers for
        enable_thinking); None for none."""
        self._chat_template_kwargs = chat_template_kwargs
        self._reasoning = self._starts_in_reasoning()
        self._held = ""  # the end of the text so far, held back: it may be the start of a tag

    def extract(self, text: str) -> tuple[str | None, str | None]:
        """A whole output -> (reasoning, content); None where a part is absent or empty, as
        vLLM returns them (deepseek_r1's reasoning: "" when empty, as vLLM's)."""
        reasoning, content = self._fresh()._parse(text, final=True)
        return reasoning or self.empty_reasoning, content or None

    def feed(self, delta_text: str) -> tuple[str, str]:
        """Streaming: the next piece of text -> (reasoning text to send now, content text to
        send now); "" for none. Only what may still turn out to be a tag is held back."""
        return self._parse(delta_text, final=False)

    def finish(self) -> tuple[str, str]:
        """End of stream: anything held back (e.g. a partial "</thi" that never completed)."""
        return self._parse("", final=True)

    def _fresh(self) -> "ReasoningParser":
        """A parser in this one's initial state, so extract leaves a stream's state alone."""
        return type(self)(chat_template_kwargs=self._chat_template_kwargs)

    def _parse(self, text: str, final: bool) -> tuple[str, str]:
        """The next text of the output -> (reasoning, content) to send now; final: the output
        ends here, so nothing is held back."""
        reasoning, content = [], []

        def send(parts: tuple[str, str]) -> None:
            reasoning.append(parts[0])
            content.append(parts[1])

        text, self._held = self._held + text, ""
        while (found := _first_tag(text, self._tags())) is not None:
            pos, tag = found
            send(self._on_text(text[:pos]))
            send(self._on_tag(tag))
            text = text[pos + len(tag):]
        num_held = 0 if final else _partial_tag_length(text, self._tags())
        send(self._on_text(text[:len(text) - num_held]))
        self._held = text[len(text) - num_held:]
        if final:
            send(self._on_end())
        return "".join(reasoning), "".join(content)

    @property
    def starts_in_reasoning(self) -> bool:
        """Whether the output begins inside a think block, which THINK_END closes: a grammar for
        the answer then holds only after it."""
        return self._starts_in_reasoning()

    @abstractmethod
    def _starts_in_reasoning(self) -> bool:
        """Whether the output starts inside the think block (opened by the prompt)."""

    @abstractmethod
    def _tags(self) -> tuple[str, ...]:
        """The tags that act in the current state; any other text is plain text."""

    @abstractmethod
    def _on_tag(self, tag: str) -> tuple[str, str]:
        """Applies a tag of _tags() -> what of it stays in the output, as (reasoning, content)."""

    def _on_text(self, text: str) -> tuple[str, str]:
        """Text between tags -> (reasoning, content)."""
        return (text, "") if self._reasoning else ("", text)

    def _on_end(self) -> tuple[str, str]:
        """The output ended -> text still kept back, as (reasoning, content)."""
        return "", ""


class Qwen3ReasoningParser(ReasoningParser):
    """vLLM's qwen3: <think> is dropped inside reasoning; </think> ends reasoning, and a
    repeated one in content is dropped (vLLM's engine absorbs it); <tool_call> inside reasoning
    ends it too and starts content (Qwen3.5 may call a tool without closing its think block),
    so that the tool-call parser finds the call in the content. With enable_thinking=False the
    output is content as it is, as vLLM returns it (as if there were no reasoning parser)."""

    def __init__(self, *, chat_template_kwargs: Mapping[str, Any] | None = None):
        self._thinking = bool((chat_template_kwargs or {}).get("enable_thinking", True))
        super().__init__(chat_template_kwargs=chat_template_kwargs)

    def extract(self, text: str) -> tuple[str | None, str | None]:
        return super().extract(text) if self._thinking else (None, text)

    def _starts_in_reasoning(self) -> bool:
        return self._thinking

    def _tags(self) -> tuple[str, ...]:
        if not self._thinking:
            return ()
        return (THINK_START, THINK_END, TOOL_CALL_START) if self._reasoning else (THINK_END,)

    def _on_tag(self, tag: str) -> tuple[str, str]:
        if tag == TOOL_CALL_START:
            self._reasoning = False
            return "", tag
        if tag == THINK_END:
            self._reasoning = False
        return "", ""


class DeepSeekR1ReasoningParser(ReasoningParser):
    """vLLM's deepseek_r1: reasoning up to the first </think>, content after it as it is (a
    second </think> included); the first <think> is dropped, with the whitespace before it."""

    empty_reasoning = ""

    def __init__(self, *, chat_template_kwargs: Mapping[str, Any] | None = None):
        super().__init__(chat_template_kwargs=chat_template_kwargs)
        self._think_seen = False
        # The output's leading whitespace, held back while <think> may still follow it (vLLM
        # drops what comes before <think>); None once other text or a tag came.
        self._leading_space: str | None = ""

    def _starts_in_reasoning(self) -> bool:
        return True  # vLLM's deepseek_r1 reads no chat_template_kwargs: R1 always thinks

    def _tags(self) -> tuple[str, ...]:
        if not self._reasoning:
            return ()
        return (THINK_END,) if self._think_seen else (THINK_START, THINK_END)

    def _on_text(self, text: str) -> tuple[str, str]:
        if self._leading_space is not None:
            if not text or text.isspace():
                self._leading_space += text
                return "", ""
            text, self._leading_space = self._leading_space + text, None
        return super()._on_text(text)

    def _on_tag(self, tag: str) -> tuple[str, str]:
        leading_space, self._leading_space = self._leading_space or "", None
        if tag == THINK_START:
            self._think_seen = True
            return "", ""
        self._reasoning = False
        return leading_space, ""

    def _on_end(self) -> tuple[str, str]:
        leading_space, self._leading_space = self._leading_space or "", None
        return leading_space, ""


def _first_tag(text: str, tags: tuple[str, ...]) -> tuple[int, str] | None:
    """The earliest of the tags in text, as (position, tag); None if none is in it."""
    return min(((pos, tag) for tag in tags if (pos := text.find(tag)) != -1), default=None)


def _partial_tag_length(text: str, tags: tuple[str, ...]) -> int:
    """How long the end of text is that may be the start of one of the tags."""
    return max((n for tag in tags for n in range(1, min(len(tag), len(text) + 1)) if text.endswith(tag[:n])),
               default=0)


REASONING_PARSERS: dict[str, type[ReasoningParser]] = {
    "qwen3": Qwen3ReasoningParser,
    "deepseek_r1": DeepSeekR1ReasoningParser,
}
