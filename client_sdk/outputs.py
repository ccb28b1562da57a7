"""What the SDK hands back: vLLM's shapes (RequestOutput holding CompletionOutput per choice),
or one streamed delta."""
from dataclasses import dataclass, field

from client_sdk.errors import request_failure
from protocol.client_messages import TokenLogprobs


@dataclass
class Logprob:
    """vLLM's: one candidate token's log probability, its rank among all tokens (1 = the most
    likely; None when unknown) and its text."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class CompletionOutput:
    """One completion of a prompt (one of its n choices), as vLLM's CompletionOutput."""

    index: int
    text: str | None  # None when the model has no tokenizer
    token_ids: list[int]
    cumulative_logprob: float | None = None
    # Per generated token: token id -> Logprob, the sampled token and the top alternatives.
    logprobs: list[dict[int, Logprob]] | None = None
    finish_reason: str | None = None  # "length" | "stop" | "abort" | "error"
    stop_reason: str | int | None = None  # the stop string or stop token id; None for EOS
    # The same logprobs as they came over the wire: the sampled token's and the top N.
    token_logprobs: list[TokenLogprobs] | None = None
    error_code: str | None = None  # when finish_reason is "error"
    error_message: str | None = None

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    """Everything one prompt produced, as vLLM's RequestOutput: outputs holds its n choices."""

    request_id: str
    prompt: str | None  # None when the prompt was given as token ids
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = True
    # SamplingParams.prompt_logprobs, vLLM's shape: per prompt token, None for the first, then
    # token id -> Logprob (the prompt token's and the top K); None when not asked.
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None
    prompt_token_logprobs: list[TokenLogprobs] | None = None  # the same as they came over the wire

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def ok(self) -> bool:
        return all(o.finish_reason in ("length", "stop") for o in self.outputs)

    @property
    def _failed(self) -> CompletionOutput | None:
        return next((o for o in self.outputs if o.finish_reason == "error"), None)

    @property
    def error_code(self) -> str | None:
        return self._failed.error_code if self._failed else None

    @property
    def error_message(self) -> str | None:
        return self._failed.error_message if self._failed else None

    def raise_for_error(self) -> "RequestOutput":
        failed = self._failed
        if failed is not None:
            raise request_failure(self.request_id, failed.error_code or "error", failed.error_message or "")
        return self


def vllm_logprobs(steps: list[TokenLogprobs], decode_each) -> list[dict[int, Logprob]]:
    """The wire's per-step logprobs in vLLM's shape; decode_each: token ids -> their texts."""
    ids = sorted({t for step in steps for t in (step.token_id, *step.top_token_ids)})
    text_of = dict(zip(ids, decode_each(ids))) if decode_each and ids else {}
    out = []
    for step in steps:
        candidates = {t: Logprob(lp, rank, text_of.get(t))
                      for rank, (t, lp) in enumerate(zip(step.top_token_ids, step.top_logprobs), start=1)}
        if step.token_id not in candidates:
            candidates = {step.token_id: Logprob(step.logprob, None, text_of.get(step.token_id)), **candidates}
        out.append(candidates)
    return out


def prompt_logprobs(entries: list[TokenLogprobs] | None, codec) -> list[dict[int, Logprob] | None] | None:
    """The wire's prompt logprobs (tokens 1..n-1) in vLLM's shape, None first."""
    if entries is None:
        return None
    return [None, *vllm_logprobs(entries, codec.decode_each if codec is not None else None)]


@dataclass
class StreamDelta:
    request_id: str
    token_ids: list[int]  # new since the previous delta of this choice
    text: str | None = None  # new text since the previous delta of this choice
    finish_reason: str | None = None
    num_prompt_tokens: int = 0
    logprobs: list[TokenLogprobs] | None = field(default=None)
    index: int = 0  # which of the n choices
    stop_reason: str | int | None = None
    prompt_logprobs: list[TokenLogprobs] | None = None  # once, on a choice's first delta with a token
