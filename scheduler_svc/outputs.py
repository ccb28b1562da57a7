"""Turning core updates into wire outputs, batched per client: one message per client per step."""
from collections import defaultdict

from protocol.client_messages import RequestOutput
from scheduler_svc.request import Request


def output_for(request: Request, new_token_ids: list[int], new_logprobs, finish_reason) -> RequestOutput | None:
    """A streaming request gets every delta; any other only its whole output when it finishes.
    Prompt logprobs go with the first output that carries a token (the prompt is scored by then);
    a pooling request's values with its one output, when it finishes."""
    if request.stream:
        first = request.prompt_logprobs is not None and len(new_token_ids) == len(request.output_token_ids) > 0
        return RequestOutput(request.request_id, new_token_ids, request.num_prompt_tokens,
                             finish_reason, new_logprobs, prompt_logprobs=request.prompt_logprobs if first else None,
                             pooled=request.pooled)
    if finish_reason is None:
        return None
    return RequestOutput(request.request_id, list(request.output_token_ids), request.num_prompt_tokens,
                         finish_reason, request.output_logprobs, prompt_logprobs=request.prompt_logprobs,
                         pooled=request.pooled)


def error_output(request_id: str, num_prompt_tokens: int, code: str, message: str) -> RequestOutput:
    return RequestOutput(request_id, [], num_prompt_tokens, "error", None, code, message)


class OutputBatcher:
    """Collects outputs per client identity during one step; `take()` hands them over."""

    def __init__(self):
        self._by_client: dict[bytes, list[RequestOutput]] = defaultdict(list)

    def add(self, client: bytes, output: RequestOutput) -> None:
        self._by_client[client].append(output)

    def drop(self, client: bytes) -> None:
        self._by_client.pop(client, None)

    def take(self) -> dict[bytes, list[RequestOutput]]:
        batches, self._by_client = self._by_client, defaultdict(list)
        return batches
