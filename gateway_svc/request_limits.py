"""What one HTTP request may ask of the gateway before it pays for it: the body's size (the
BodyLimit middleware, so every route has it), the prompts in it, its JSON nesting. The limits
of each request the SDK sends are the protocol's (protocol/limits.py), checked by the SDK.
"""
from dataclasses import dataclass

from gateway_svc.errors import APIError, bad_request
from protocol.limits import MAX_PROMPT_TOKENS

# Room for the longest prompt the protocol takes written as JSON token ids (MAX_PROMPT_TOKENS of
# at most 7 digits and a comma: 8 MiB) four times over, or a text prompt of that many tokens of
# 32 bytes each. A body is held twice while parsed (bytes, then Python objects), so this bounds a
# request's parse at a few hundred MB.
DEFAULT_MAX_REQUEST_BODY_BYTES = 4 * 8 * MAX_PROMPT_TOKENS
# A batch input file (POST /v1/files) is spooled to disk, not parsed whole: OpenAI's own bound on one.
MAX_UPLOAD_BYTES = 200 << 20
UPLOAD_PATHS = ("/v1/files",)
# OpenAI's completions take a list of prompts; each is a stream of its own here (n of them with
# n choices). A list longer than this is a batch job: the SDK's generate_batch or the Batch API.
DEFAULT_MAX_PROMPTS_PER_REQUEST = 1024
# Deeper than any chat message or template argument needs; the JSON decoder's own limit (Python's
# recursion limit, ~1000) is a 400 too, not a RecursionError.
MAX_JSON_DEPTH = 32


@dataclass(frozen=True)
class RequestLimits:
    max_request_body_bytes: int = DEFAULT_MAX_REQUEST_BODY_BYTES  # 0: no bound
    max_prompts_per_request: int = DEFAULT_MAX_PROMPTS_PER_REQUEST

    def max_body_bytes(self, path: str) -> int:
        """The bound on a body sent to this path (0: none)."""
        if path in UPLOAD_PATHS and self.max_request_body_bytes:
            return max(self.max_request_body_bytes, MAX_UPLOAD_BYTES)
        return self.max_request_body_bytes

    def check_num_prompts(self, num_prompts: int) -> None:
        if num_prompts > self.max_prompts_per_request:
            raise bad_request(f"{num_prompts} prompts in one request: at most {self.max_prompts_per_request} "
                              "(--max-prompts-per-request); send a larger job as a batch", param="prompt")


def body_too_large(max_bytes: int) -> APIError:
    return APIError(413, f"the request body is larger than {max_bytes} bytes (--max-request-body-bytes)",
                    "request_too_large")


def check_depth(value, param: str, limit: int = MAX_JSON_DEPTH) -> None:
    """A 400 when lists and objects nest deeper than limit in value; iterative, so any depth is safe."""
    stack = [(value, 1)] if isinstance(value, (dict, list)) else []
    while stack:
        node, depth = stack.pop()
        children = node.values() if isinstance(node, dict) else node
        if depth > limit:
            raise bad_request(f"{param} nests lists and objects deeper than {limit} levels", param=param)
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
