"""One line of an OpenAI batch file: read into a request for one of the gateway's endpoints, and
the output line for its outcome, in OpenAI's batch output format.

Input: {"custom_id", "method": "POST", "url", "body"}, url one of ENDPOINTS: /v1/completions,
/v1/chat/completions, and for a pooling model /v1/embeddings, /v1/score, /v1/rerank, /v1/classify.
Output: {"id", "custom_id", "response", "error"}. A request the endpoint answers has its
`response` {"status_code", "request_id", "body"}, the body exactly as the HTTP endpoint would
send it (the same parsing, checks and formatter: completions.completion_job,
chat.chat_completion_job, embeddings.embedding_job, ...); one it refuses gets the endpoint's
error as that body and the same error in `error`. A line that is not a request at all (not
JSON, no valid custom_id, a custom_id seen before, an unknown url or, in a Batch API batch, a
url other than the batch's endpoint) has no response and its `error` names the line, as
OpenAI's batch errors do ({"code", "message", "line"}); that line number is also what a
resumed job matches it by.
"""
from dataclasses import dataclass
from typing import Any

import msgspec

from gateway_svc.chat import chat_completion_job
from gateway_svc.classify import classify_job
from gateway_svc.completions import completion_job
from gateway_svc.embeddings import embedding_job
from gateway_svc.errors import APIError
from gateway_svc.ids import new_id
from gateway_svc.scores import rerank_job, score_job

# OpenAI documents no bound; this one keeps every custom_id cheap to hold and to look up.
MAX_CUSTOM_ID_LEN = 512
# url -> what checks a line's body: a (Job, Formatter) to generate, or a PoolingJob.
ENDPOINTS = {"/v1/completions": completion_job, "/v1/chat/completions": chat_completion_job,
             "/v1/embeddings": embedding_job, "/v1/score": score_job, "/v1/rerank": rerank_job,
             "/v1/classify": classify_job}
_decoder = msgspec.json.Decoder()


class LineError(Exception):
    """A line that is not a request of this batch; its custom_id when it had a valid one."""

    def __init__(self, code: str, message: str, custom_id: str | None = None):
        super().__init__(message)
        self.code, self.message, self.custom_id = code, message, custom_id


@dataclass(slots=True)
class BatchLine:
    line_no: int  # 1-based, as OpenAI numbers a batch file's lines
    custom_id: str
    url: str
    body: dict[str, Any]


def custom_id_of(raw: bytes, line_no: int) -> tuple[dict, str]:
    """The line's JSON object and its custom_id; LineError when either is not valid."""
    try:
        obj = _decoder.decode(raw)
    except msgspec.DecodeError as e:
        raise LineError("invalid_json", f"line {line_no} is not valid JSON: {e}") from None
    if not isinstance(obj, dict):
        raise LineError("invalid_json", f"line {line_no} is not a JSON object")
    custom_id = obj.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        raise LineError("invalid_custom_id", f"line {line_no}: custom_id must be a non-empty string")
    if len(custom_id) > MAX_CUSTOM_ID_LEN:
        raise LineError("invalid_custom_id", f"line {line_no}: custom_id is {len(custom_id)} characters long, "
                                             f"more than {MAX_CUSTOM_ID_LEN}")
    return obj, custom_id


def request_of(obj: dict, custom_id: str, line_no: int, endpoint: str | None = None) -> BatchLine:
    """The line as a request; LineError for a method, url or body this batch cannot run.
    endpoint: the batch's (the Batch API's), which every line's url must equal, as OpenAI
    requires; None (run-batch) takes each line's url."""
    url = obj.get("url")
    if url not in ENDPOINTS:
        raise LineError("invalid_url", f"line {line_no}: url {url!r} is not one of {sorted(ENDPOINTS)}", custom_id)
    if endpoint is not None and url != endpoint:
        raise LineError("url_mismatch", f"line {line_no}: url {url!r} is not the batch's endpoint {endpoint!r}",
                        custom_id)
    if obj.get("method", "POST") != "POST":
        raise LineError("invalid_method", f"line {line_no}: method must be POST", custom_id)
    body = obj.get("body")
    if not isinstance(body, dict):
        raise LineError("invalid_body", f"line {line_no}: body must be a JSON object", custom_id)
    return BatchLine(line_no, custom_id, url, body)


def line_error_output(line_no: int, e: LineError) -> dict:
    return {"id": new_id("batch_req_"), "custom_id": e.custom_id, "response": None,
            "error": {"code": e.code, "message": e.message, "line": line_no}}


def response_output(custom_id: str, request_id: str, body: dict) -> dict:
    return {"id": new_id("batch_req_"), "custom_id": custom_id,
            "response": {"status_code": 200, "request_id": request_id, "body": body}, "error": None}


def refused_output(custom_id: str, request_id: str, e: APIError) -> dict:
    """The endpoint's answer to a request it refused (or that failed), as an error line."""
    return {"id": new_id("batch_req_"), "custom_id": custom_id,
            "response": {"status_code": e.status, "request_id": request_id, "body": e.body()},
            "error": {"code": e.code, "message": e.message}}


def done_key(output: dict) -> tuple[str | None, int | None]:
    """What a resumed job matches an output line by: (custom_id, None) for a request's outcome,
    (None, line number) for a line that was not a request."""
    error = output.get("error") or {}
    if "line" in error:
        return None, error["line"]
    return output.get("custom_id"), None
