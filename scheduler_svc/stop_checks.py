"""When a request stops, checked once per sampled token."""
from scheduler_svc.request import Request


def reaches_length(request: Request, num_outputs: int, max_len: int) -> bool:
    """Whether num_outputs generated tokens end the request by length: max_tokens, or the
    model (or pool) length."""
    return num_outputs >= request.params.max_tokens or request.num_prompt_tokens + num_outputs >= max_len


def check_stop(request: Request, token_id: int, eos_token_ids: frozenset[int], max_len: int) -> str | None:
    """Finish reason after `token_id` was appended to `request`, or None to keep going.

    Length wins over stop, like vLLM: max_tokens, then the model (or pool) length; EOS and
    stop tokens count only once min_tokens outputs exist, and EOS not with ignore_eos.
    """
    params = request.params
    num_outputs = len(request.output_token_ids)
    if reaches_length(request, num_outputs, max_len):
        return "length"
    if num_outputs >= params.min_tokens:
        if not params.ignore_eos and token_id in eos_token_ids:
            return "stop"
        if params.stop_token_ids and token_id in params.stop_token_ids:
            return "stop"
    return None
