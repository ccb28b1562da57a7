"""gateway_svc.reasoning_parsers: whole outputs split as vLLM's parsers split them (qwen3: its
Qwen3Parser engine run as a reasoning parser; deepseek_r1: BaseThinkingReasoningParser.
extract_reasoning), and a stream, however its text is cut into pieces, sending what the whole
output gives."""
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway_svc.reasoning_parsers import REASONING_PARSERS, DeepSeekR1ReasoningParser, Qwen3ReasoningParser

NO_THINKING = {"enable_thinking": False}

# (text, qwen3's (reasoning, content), deepseek_r1's (reasoning, content))
WHOLE_OUTPUTS = [
    # No tags: the model is still thinking (the prompt opened the think block; cut by max_tokens).
    ("The answer is 4.", ("The answer is 4.", None), ("The answer is 4.", None)),
    # Both tags, the newlines around them kept in both parts.
    ("<think>\nLet me add.\n2 + 2 = 4\n</think>\n\nThe answer is 4.",
     ("\nLet me add.\n2 + 2 = 4\n", "\n\nThe answer is 4."), ("\nLet me add.\n2 + 2 = 4\n", "\n\nThe answer is 4.")),
    # Only </think>: the template put <think> in the prompt.
    ("Let me add.\n</think>\n\n4", ("Let me add.\n", "\n\n4"), ("Let me add.\n", "\n\n4")),
    # Only <think>: cut off while thinking.
    ("<think>\nStill adding", ("\nStill adding", None), ("\nStill adding", None)),
    # Whitespace before <think>: the deepseek_r1 parser drops what precedes <think>; qwen3's
    # engine keeps it as reasoning.
    ("\n<think>r</think>a", ("\nr", "a"), ("r", "a")),
    # Empty reasoning: qwen3's engine gives None, deepseek_r1 the empty partition.
    ("<think></think>Answer", (None, "Answer"), ("", "Answer")),
    ("<think>\n\n</think>\n\nAnswer", ("\n\n", "\n\nAnswer"), ("\n\n", "\n\nAnswer")),
    ("</think>Answer", (None, "Answer"), ("", "Answer")),
    # Nothing after </think>: content None.
    ("<think>r</think>", ("r", None), ("r", None)),
    ("</think>", (None, None), ("", None)),
    ("", (None, None), ("", None)),
    # Whitespace-only content is content.
    ("r</think>\n\n", ("r", "\n\n"), ("r", "\n\n")),
    # A second </think>: qwen3's engine drops it, deepseek_r1 keeps it in the content.
    ("a</think>b</think>c", ("a", "bc"), ("a", "b</think>c")),
    # A second <think> inside reasoning: qwen3's engine drops every one, deepseek_r1 only the first.
    ("<think>a<think>b</think>c", ("ab", "c"), ("a<think>b", "c")),
    # <tool_call> ends qwen3's reasoning and starts its content; to deepseek_r1 it is text.
    ("I need the weather.\n<tool_call>\n{\"name\": \"weather\"}\n</tool_call>",
     ("I need the weather.\n", "<tool_call>\n{\"name\": \"weather\"}\n</tool_call>"),
     ("I need the weather.\n<tool_call>\n{\"name\": \"weather\"}\n</tool_call>", None)),
    ("r</think>\n\n<tool_call>\n{}\n</tool_call>", ("r", "\n\n<tool_call>\n{}\n</tool_call>"),
     ("r", "\n\n<tool_call>\n{}\n</tool_call>")),
    # A tag cut off at the end is text.
    ("Let me add.</thi", ("Let me add.</thi", None), ("Let me add.</thi", None)),
    ("<think", ("<think", None), ("<think", None)),
    # Unicode.
    ("<think>思考中 🤔 ça va</think>答案：四 ✓", ("思考中 🤔 ça va", "答案：四 ✓"), ("思考中 🤔 ça va", "答案：四 ✓")),
    # Tags written in content are text (a repeated </think> aside, for qwen3).
    ("r</think>Wrap it in <think> tags.", ("r", "Wrap it in <think> tags."), ("r", "Wrap it in <think> tags.")),
]

# Where the stream's rules part from vLLM's deepseek_r1, which splits a whole output by text a
# stream has not seen yet: it drops everything before the first <think> (here only leading
# whitespace goes; other text stays reasoning, as vLLM's token stream sends it), and restarts
# the split at a <think> after </think> (here that <think> is content). qwen3's engine splits
# these so itself.
# (text, qwen3's, deepseek_r1's, vLLM's deepseek_r1's whole-output split)
BEYOND_A_STREAM = [
    ("Hmm.\n<think>r</think>a", ("Hmm.\nr", "a"), ("Hmm.\nr", "a"), ("r", "a")),
    ("a</think>b<think>c", ("a", "b<think>c"), ("a", "b<think>c"), ("c", None)),
]

NO_THINKING_OUTPUTS = [
    ("The answer is 4.", (None, "The answer is 4.")),
    ("\n\nThe answer is 4.", (None, "\n\nThe answer is 4.")),
    # vLLM's Qwen3Parser returns the output as it is, tags and all, and "" as "".
    ("<think>r</think>a", (None, "<think>r</think>a")),
    ("", (None, "")),
]

STREAMED_TEXTS = ([text for text, _, _ in WHOLE_OUTPUTS] + [text for text, *_ in BEYOND_A_STREAM]
                  + ["\n \n<think>r</think>a", " \n</think>a", "  ", "<<think>>a<</think>>b", "r<tool_call<think>"])

PARSERS = [("qwen3", None), ("qwen3", NO_THINKING), ("deepseek_r1", None)]


def streamed(name: str, kwargs: dict | None, pieces: list[str]) -> tuple[str, str]:
    """The pieces fed one by one, then finish: all the reasoning and all the content sent."""
    parser = REASONING_PARSERS[name](chat_template_kwargs=kwargs)
    sent = [parser.feed(piece) for piece in pieces] + [parser.finish()]
    return "".join(r for r, _ in sent), "".join(c for _, c in sent)


def whole(name: str, kwargs: dict | None, text: str) -> tuple[str, str]:
    reasoning, content = REASONING_PARSERS[name](chat_template_kwargs=kwargs).extract(text)
    return reasoning or "", content or ""


def test_the_parsers_are_registered_by_vllms_names():
    assert REASONING_PARSERS == {"qwen3": Qwen3ReasoningParser, "deepseek_r1": DeepSeekR1ReasoningParser}


@pytest.mark.parametrize("text, qwen3, deepseek_r1", WHOLE_OUTPUTS)
def test_a_whole_output_splits_as_vllm_splits_it(text, qwen3, deepseek_r1):
    assert Qwen3ReasoningParser().extract(text) == qwen3
    assert DeepSeekR1ReasoningParser().extract(text) == deepseek_r1


@pytest.mark.parametrize("text, qwen3, deepseek_r1, vllm_deepseek_r1", BEYOND_A_STREAM)
def test_text_before_think_and_think_after_it_split_as_a_stream_can(text, qwen3, deepseek_r1, vllm_deepseek_r1):
    assert Qwen3ReasoningParser().extract(text) == qwen3
    assert DeepSeekR1ReasoningParser().extract(text) == deepseek_r1 != vllm_deepseek_r1


@pytest.mark.parametrize("text, expected", NO_THINKING_OUTPUTS)
def test_qwen3_without_thinking_is_all_content(text, expected):
    assert Qwen3ReasoningParser(chat_template_kwargs=NO_THINKING).extract(text) == expected


def test_deepseek_r1_always_thinks():
    """vLLM's deepseek_r1 reads no chat_template_kwargs."""
    assert DeepSeekR1ReasoningParser(chat_template_kwargs=NO_THINKING).extract("r</think>a") == ("r", "a")


@pytest.mark.parametrize("name, kwargs", PARSERS)
@pytest.mark.parametrize("text", STREAMED_TEXTS)
def test_a_stream_cut_anywhere_sends_what_the_whole_output_gives(name, kwargs, text):
    expected = whole(name, kwargs, text)
    for cut in range(len(text) + 1):
        assert streamed(name, kwargs, [text[:cut], text[cut:]]) == expected, cut
    assert streamed(name, kwargs, list(text)) == expected


@pytest.mark.parametrize("name, kwargs", PARSERS)
@given(pieces=st.lists(st.lists(st.sampled_from(["<think>", "</think>", "<tool_call>", "<", "</", "<th", "ink>",
                                                 "think", ">", "/", "a", " ", "\n", "é"]), max_size=6).map("".join),
                       max_size=8))
def test_a_stream_of_tag_fragments_sends_what_the_whole_output_gives(name, kwargs, pieces):
    assert streamed(name, kwargs, pieces) == whole(name, kwargs, "".join(pieces))


def test_a_stream_sends_text_as_soon_as_it_cannot_be_a_tag():
    parser = Qwen3ReasoningParser()
    assert parser.feed("Let me think") == ("Let me think", "")
    assert parser.feed(" more <") == (" more ", "")  # "<" may open </think>
    assert parser.feed("/thi") == ("", "")
    assert parser.feed("nk>\n\nThe") == ("", "\n\nThe")
    assert parser.feed(" answer</th") == ("", " answer")
    assert parser.finish() == ("", "</th")  # never completed: text


def test_deepseek_r1_holds_back_leading_whitespace_only_until_it_knows():
    parser = DeepSeekR1ReasoningParser()
    assert parser.feed("\n") == ("", "")  # <think> may follow, and would drop it
    assert parser.feed("\nSo") == ("\n\nSo", "")
    parser = DeepSeekR1ReasoningParser()
    assert parser.feed("\n<think>") == ("", "")
    assert parser.feed("\nSo") == ("\nSo", "")


def test_extract_leaves_a_streams_state_alone():
    parser = Qwen3ReasoningParser()
    assert parser.feed("r</think>") == ("r", "")
    assert parser.extract("abc") == ("abc", None)
    assert parser.feed("c") == ("", "c")
