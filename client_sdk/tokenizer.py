"""Client-side tokenizer: the scheduler relays the worker's tokenizer.json, the SDK uses it.

Long texts are tokenized off the event loop, in a thread pool, through `encode_batch_fast`,
which releases the GIL: one long prompt must not stall every other stream of the process (the
HTTP gateway's /health included). Short ones are tokenized in place, where a thread hop would
cost more than the tokenizing. Per-step detokenization stays in place: it decodes the few
tokens of one step (DecodeStream), whatever the length of the output.
"""
import asyncio
import concurrent.futures
import functools

from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream

from client_sdk.errors import PromptTooLong
from client_sdk.token_span import max_chars_per_token

# Up to this many characters a text is tokenized on the caller's thread: the presets' byte-level
# BPE takes ~0.4 ms for 100 characters, about what handing it to a thread and back costs.
INLINE_ENCODE_CHARS = 256


@functools.cache
def _tokenizing_pool() -> concurrent.futures.ThreadPoolExecutor:
    return concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="stepserve-tokenize")


async def off_loop(fn, *args):
    """fn(*args) in the tokenizing threads, so that the event loop keeps serving meanwhile."""
    return await asyncio.get_running_loop().run_in_executor(_tokenizing_pool(), fn, *args)


class TextCodec:
    def __init__(self, tokenizer_json: str, max_model_len: int = 0):
        """max_model_len: the model's context (0: unknown), past which a text is refused untokenized."""
        self.tokenizer = Tokenizer.from_str(tokenizer_json)
        self.max_model_len = max_model_len
        self.max_chars_per_token = max_chars_per_token(tokenizer_json)  # None: no bound for this tokenizer

    def check_fits(self, text: str) -> None:
        """PromptTooLong when the text has more characters than max_model_len tokens can cover."""
        if self.max_model_len and self.max_chars_per_token and \
                len(text) > self.max_model_len * self.max_chars_per_token:
            raise PromptTooLong(f"the prompt has {len(text)} characters, more than the model's context of "
                                f"{self.max_model_len} tokens can hold (a token of this tokenizer covers at most "
                                f"{self.max_chars_per_token} characters)")

    async def encode_async(self, texts: list[str], add_special_tokens: bool = True) -> list[list[int]]:
        """The token ids of each text, after check_fits; tokenized off the event loop when long."""
        for text in texts:
            self.check_fits(text)
        if sum(map(len, texts)) <= INLINE_ENCODE_CHARS:
            return [self.encode(text, add_special_tokens) for text in texts]
        return await off_loop(self._encode_batch, texts, add_special_tokens)

    def _encode_batch(self, texts: list[str], add_special_tokens: bool) -> list[list[int]]:
        return [e.ids for e in self.tokenizer.encode_batch_fast(texts, add_special_tokens=add_special_tokens)]

    async def encode_pairs_async(self, pairs: list[tuple[str, str]]) -> list[tuple[list[int], list[int]]]:
        """Each pair tokenized as one input of two segments, as a cross-encoder reads it
        (tokenizers' encode(a, b)): its token ids and its segment (token type) ids."""
        for pair in pairs:
            for text in pair:
                self.check_fits(text)
        if sum(len(a) + len(b) for a, b in pairs) <= INLINE_ENCODE_CHARS:
            return self._encode_pairs(pairs)
        return await off_loop(self._encode_pairs, pairs)

    def _encode_pairs(self, pairs: list[tuple[str, str]]) -> list[tuple[list[int], list[int]]]:
        return [(e.ids, e.type_ids) for e in self.tokenizer.encode_batch_fast(pairs)]

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
