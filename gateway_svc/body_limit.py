"""BodyLimit, an ASGI middleware: a request body past the bound is refused with 413 before it is
read in full, at once from its Content-Length, or as its bytes arrive (a chunked upload): the
route's receive raises, so no route pays for more than the bound, whatever it reads."""
from gateway_svc.request_limits import RequestLimits, body_too_large


def declared_length(scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


class BodyLimit:
    def __init__(self, app, limits: RequestLimits):
        self.app, self.limits = app, limits

    async def __call__(self, scope, receive, send) -> None:
        max_bytes = self.limits.max_body_bytes(scope["path"]) if scope["type"] == "http" else 0
        if not max_bytes:
            return await self.app(scope, receive, send)
        declared = declared_length(scope)
        if declared is not None and declared > max_bytes:
            # Answered without reading: the server discards what the client still sends.
            return await body_too_large(max_bytes).response()(scope, receive, send)
        num_bytes = 0

        async def counting_receive():
            nonlocal num_bytes
            message = await receive()
            if message["type"] == "http.request":
                num_bytes += len(message.get("body", b""))
                if num_bytes > max_bytes:
                    raise body_too_large(max_bytes)  # the route's APIError handler answers it
            return message

        await self.app(scope, counting_receive, send)
