"""The text of one completion while its tokens arrive: detokenized incrementally, stop strings
matched on it, and the part of it that is safe to stream (vLLM's rules)."""
from client_sdk.tokenizer import IncrementalDecoder, TextCodec
from protocol.sampling import SamplingParams


class CompletionText:
    def __init__(self, codec: TextCodec, params: SamplingParams):
        self._decoder = IncrementalDecoder(codec)
        self._stop = params.stop or []
        self._include_stop = params.include_stop_str_in_output
        self._max_stop_len = max(map(len, self._stop), default=0)
        # Without the stop string in the output, text that may be the start of one is held back
        # from deltas until it is known not to be (vLLM's stop buffer).
        self._num_held = self._max_stop_len - 1 if self._stop and not self._include_stop else 0
        self.text = ""
        self.num_chars_sent = 0
        self.stop_reason: str | None = None  # the stop string that ended the output

    def push(self, token_ids: list[int]) -> int | None:
        """Appends the tokens' text. When a stop string matched, the text now ends before it
        (after it with include_stop_str_in_output) and the return value says how many of
        these tokens belong to the output: the one that completed the match is the last."""
        if not self._stop:
            self.text += self._decoder.push(token_ids)
            return None
        for i, token_id in enumerate(token_ids):  # one by one: the match may end mid-delta
            piece = self._decoder.push([token_id])
            if piece:
                start = max(0, len(self.text) - self._max_stop_len + 1)  # a match may straddle
                self.text += piece
                if self._cut_at_stop(start):
                    return i + 1
        return None

    def _cut_at_stop(self, start: int) -> bool:
        found = [(pos, s) for s in self._stop if (pos := self.text.find(s, start)) != -1]
        if not found:
            return False
        pos, self.stop_reason = min(found)
        self.text = self.text[:pos + len(self.stop_reason) if self._include_stop else pos]
        return True

    def finish(self, token_ids: list[int]) -> None:
        """The output ended without a stop string: add what the decoder still held back."""
        if self.stop_reason is None:
            self.text += self._decoder.flush(token_ids, self.text)

    def take_delta(self, finished: bool) -> str:
        """Text not handed out yet, less what may still turn out to start a stop string."""
        end = len(self.text) if finished else max(self.num_chars_sent, len(self.text) - self._num_held)
        delta = self.text[self.num_chars_sent:end]
        self.num_chars_sent = end
        return delta
