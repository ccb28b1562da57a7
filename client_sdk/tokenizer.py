"""Client-side tokenizer: the scheduler relays the worker's tokenizer.json, the SDK uses it."""
from tokenizers import Tokenizer


class TextCodec:
    def __init__(self, tokenizer_json: str):
        self._tokenizer = Tokenizer.from_str(tokenizer_json)

    def encode(self, text: str) -> list[int]:
        return self._tokenizer.encode(text).ids

    def decode(self, token_ids: list[int]) -> str:
        return self._tokenizer.decode(token_ids, skip_special_tokens=True)


class IncrementalDecoder:
    """Text deltas for a stream: decodes the whole output and hands out what is new, holding
    back a trailing partial UTF-8 character until the token that completes it arrives."""

    def __init__(self, codec: TextCodec):
        self._codec = codec
        self._token_ids: list[int] = []
        self._num_chars_sent = 0

    def push(self, token_ids: list[int], final: bool = False) -> str:
        self._token_ids.extend(token_ids)
        text = self._codec.decode(self._token_ids)
        end = len(text) if final or not text.endswith("\ufffd") else len(text.rstrip("\ufffd"))
        delta = text[self._num_chars_sent:end]
        self._num_chars_sent = max(self._num_chars_sent, end)
        return delta
