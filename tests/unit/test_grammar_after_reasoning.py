"""A grammar that holds after a reasoning span (StructuredOutputsParams.after_token_ids), on the
worker's StructuredOutputs with xgrammar and a byte-level tokenizer: free until the output holds
the marker, constrained from the next token on; a request rescheduled with the marker already
in its output replays what followed it."""
import numpy as np
from tokenizers import Tokenizer

from protocol.sampling import StructuredOutputsParams
from worker_svc.byte_tokenizer import LLAMA_SPECIALS, byte_tokenizer_json
from worker_svc.structured_outputs import StructuredOutputs

VOCAB = 1000
TOKENIZER = byte_tokenizer_json(VOCAB, LLAMA_SPECIALS)
ENCODE = Tokenizer.from_str(TOKENIZER)
MARKER = ENCODE.encode("</think>", add_special_tokens=False).ids
PROMPT = ENCODE.encode("question", add_special_tokens=False).ids
ANSWER = StructuredOutputsParams(regex="[a-c]{1,3}", after_token_ids=MARKER)


def _token(text: str) -> int:
    [token] = ENCODE.encode(text, add_special_tokens=False).ids
    return token


def _allowed(grammar, index: int) -> set[int]:
    grammar.wait()
    words = grammar.bitmask[index].tolist()
    return {t for t in range(VOCAB) if (words[t // 32] >> (t % 32)) & 1}


def _constrained_rows(outputs: StructuredOutputs, rows: np.ndarray) -> tuple[list[int], object]:
    grammar = outputs.for_step(rows)
    constrained = [int(rows[i]) for i in grammar.indices] if grammar is not None else []
    return constrained, grammar


def test_free_until_the_marker_then_held_to_the_grammar():
    outputs = StructuredOutputs(TOKENIZER, VOCAB, [LLAMA_SPECIALS["</s>"]])
    outputs.add(7, ANSWER, PROMPT, len(PROMPT))
    outputs.add(8, StructuredOutputsParams(regex="[a-c]{1,3}"), PROMPT, len(PROMPT))  # no marker: at once
    rows = np.array([7, 8])
    thinking = ENCODE.encode("hmm </thin", add_special_tokens=False).ids + MARKER
    for position, token in enumerate(thinking):
        constrained, grammar = _constrained_rows(outputs, rows)
        assert constrained == [8], f"row 7 is free while it thinks (token {position})"
        outputs.on_sampled(rows, np.array([token, _token("a")]) if position == 0 else np.array([token, _token("b")]))
    constrained, grammar = _constrained_rows(outputs, rows)
    assert constrained == [7, 8]
    assert _allowed(grammar, 0) == {_token(c) for c in "abc"}
    outputs.on_sampled(rows, np.array([_token("c"), _token("c")]))
    _, grammar = _constrained_rows(outputs, rows)
    assert {_token(c) for c in "abc"} <= _allowed(grammar, 0)  # "c" was accepted: one or two more, or the end


def test_a_rescheduled_request_replays_what_followed_the_marker():
    outputs = StructuredOutputs(TOKENIZER, VOCAB, [LLAMA_SPECIALS["</s>"]])
    generated = ENCODE.encode("so", add_special_tokens=False).ids + MARKER + [_token("a"), _token("b"), _token("c")]
    outputs.add(3, ANSWER, PROMPT + generated, len(PROMPT))
    constrained, grammar = _constrained_rows(outputs, np.array([3]))
    assert constrained == [3]
    assert _allowed(grammar, 0) == {LLAMA_SPECIALS["</s>"]}  # "abc" replayed: the regex is complete
    waiting = StructuredOutputs(TOKENIZER, VOCAB, [LLAMA_SPECIALS["</s>"]])
    waiting.add(4, ANSWER, PROMPT + MARKER[:-1], len(PROMPT))  # cut inside the marker: still free
    assert _constrained_rows(waiting, np.array([4]))[0] == []
    waiting.on_sampled(np.array([4]), np.array([MARKER[-1]]))
    assert _constrained_rows(waiting, np.array([4]))[0] == [4]
