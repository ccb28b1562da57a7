"""Client-side tokenizer: the scheduler relays the worker's tokenizer.json, the SDK uses it."""
from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream


class TextCodec:
    def __init__(self, tokenizer_json: str):
        self.tokenizer = Tokenizer.from_str(tokenizer_json)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """add_special_tokens=False for a rendered chat, whose template wrote them already
        (as transformers' apply_chat_template tokenizes)."""
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    def decode_each(self, token_ids: list[int]) -> list[str]:
        """Each token's own text (for logprobs)."""
        return self.tokenizer.decode_batch([[t] for t in token_ids], skip_special_tokens=False)


class IncrementalDecoder:
    """Text deltas as tokens arrive, with tokenizers' DecodeStream: each step decodes only a
    short window of recent tokens, never the whole output again, and holds back a partial
    UTF-8 character until the token that completes it arrives."""

    def __init__(self, codec: TextCodec):
        self._codec = codec
        self._stream = DecodeStream(skip_special_tokens=True)
        self._num_pending = 0  # tokens pushed since the stream last produced text

    def push(self, token_ids: list[int]) -> str:
        if not token_ids:
            return ""
        piece = self._stream.step(self._codec.tokenizer, token_ids)
        if piece is None:
            self._num_pending += len(token_ids)
            return ""
        self._num_pending = 0
        return piece

    def flush(self, token_ids: list[int], text_so_far: str) -> str:
        """At the end: the text of tokens still held back, as a whole decode has it (an
        incomplete character decodes to U+FFFD). Decodes the whole output, but only in that
        rare case. token_ids: the whole output; text_so_far: what push returned, joined."""
        if not self._num_pending:
            return ""
        self._num_pending = 0
        whole = self._codec.decode(token_ids)
        return whole[len(text_so_far):] if whole.startswith(text_so_far) else ""
