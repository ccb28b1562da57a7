"""Errors in OpenAI's shape, {"error": {"message", "type", "param", "code"}}, and the status
each failure gets: 400 bad parameters or prompt, 401 key, 404 model, 413 body too large, 503 no
worker or overloaded."""
import logging

import msgspec
from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from client_sdk.errors import ChatTemplateError, PromptTooLong, RequestError, ServiceError
from protocol import ErrorCode

logger = logging.getLogger("stepserve.gateway")
_encoder = msgspec.json.Encoder()

# The scheduler's per-request error codes that are the caller's fault, and those that say "later".
_CLIENT_ERRORS = {ErrorCode.INVALID_PARAMS, ErrorCode.PROMPT_TOO_LONG, ErrorCode.DUPLICATE_ID}
_UNAVAILABLE_ERRORS = {ErrorCode.OVERLOADED, ErrorCode.SHUTTING_DOWN}


class APIError(Exception):
    def __init__(self, status: int, message: str, code: str, type: str = "invalid_request_error",
                 param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.type, self.param = status, message, code, type, param

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> Response:
        return Response(_encoder.encode(self.body()), status_code=self.status, media_type="application/json")


def bad_request(message: str, code: str = "invalid_params", param: str | None = None) -> APIError:
    return APIError(400, message, code, param=param)


def unavailable(message: str, code: str) -> APIError:
    return APIError(503, message, code, type="service_unavailable")


def from_sdk_error(e: Exception) -> APIError:
    """What a failure of the SDK call means for the HTTP caller."""
    if isinstance(e, RequestError):
        if e.code in _CLIENT_ERRORS:
            return bad_request(e.message, e.code)
        if e.code in _UNAVAILABLE_ERRORS:
            return unavailable(e.message, e.code)
        return APIError(500, e.message, e.code, type="internal_error")
    if isinstance(e, PromptTooLong):
        return bad_request(str(e), e.code, param="prompt")
    if isinstance(e, ChatTemplateError):
        return bad_request(str(e), "chat_template")
    if isinstance(e, ServiceError):
        return unavailable(e.message, e.code)
    if isinstance(e, ValueError):
        return bad_request(str(e))
    logger.exception("request failed", exc_info=e)
    return APIError(500, f"internal error: {type(e).__name__}", "internal", type="internal_error")


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(request: Request, e: APIError):
        return e.response()

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, e: StarletteHTTPException):  # unknown routes, wrong methods
        return APIError(e.status_code, str(e.detail), "not_found" if e.status_code == 404 else "http_error").response()

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, e: Exception):
        return from_sdk_error(e).response()
