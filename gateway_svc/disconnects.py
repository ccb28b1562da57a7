"""Clients that go away before their answer is complete: normal for an HTTP server (a timeout, a
Ctrl-C, a flood of dropped connections), so each is counted and logged at debug level, never an
error with a traceback. Their SDK requests are aborted where they run (responses.serve)."""
import logging

from prometheus_client import Counter
from starlette.requests import ClientDisconnect

from protocol.metrics import PREFIX

logger = logging.getLogger("stepserve.gateway")


class Disconnects:
    def __init__(self, registry):
        self.counter = Counter(PREFIX + "http_client_disconnects", "HTTP clients that went away before their "
                               "response was complete (their requests were aborted).", registry=registry)

    def client_gone(self, scope) -> None:
        self.counter.inc()
        logger.debug("client %s went away before the response to %s was complete", scope.get("client"),
                     scope.get("path"))


class CountDisconnects:
    """ASGI middleware: a ClientDisconnect (raised while reading a body, or by a route whose
    client left while it waited) ends the request quietly; nobody is left to answer."""

    def __init__(self, app, disconnects: Disconnects):
        self.app, self.disconnects = app, disconnects

    async def __call__(self, scope, receive, send) -> None:
        try:
            await self.app(scope, receive, send)
        except ClientDisconnect:
            self.disconnects.client_gone(scope)
