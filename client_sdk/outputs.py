"""What the SDK hands back: a whole completion, or one streamed delta."""
from dataclasses import dataclass, field

from client_sdk.errors import RequestError
from protocol.client_messages import TokenLogprobs


@dataclass
class CompletionOutput:
    request_id: str
    token_ids: list[int]
    num_prompt_tokens: int
    finish_reason: str | None  # "length" | "stop" | "abort" | "error"
    text: str | None = None  # when the model has a tokenizer
    logprobs: list[TokenLogprobs] | None = None
    error_code: str | None = None
    error_message: str | None = None

    @property
    def ok(self) -> bool:
        return self.finish_reason in ("length", "stop")

    def raise_for_error(self) -> "CompletionOutput":
        if self.finish_reason == "error":
            raise RequestError(self.request_id, self.error_code or "error", self.error_message or "")
        return self


@dataclass
class StreamDelta:
    request_id: str
    token_ids: list[int]  # new since the previous delta
    text: str | None = None  # new text since the previous delta
    finish_reason: str | None = None
    num_prompt_tokens: int = 0
    logprobs: list[TokenLogprobs] | None = field(default=None)
