"""Upstream: the scheduler as the gateway sees it, through one AsyncClient: the served model,
a briefly cached health (a request must not cost a health round trip), and admission
(503 at once with no worker joined, or past --max-num-requests in flight here)."""
import asyncio
import time

from client_sdk.client import AsyncClient
from gateway_svc.chat_parsing import ChatParsing
from gateway_svc.disconnects import Disconnects
from gateway_svc.request_limits import RequestLimits
from gateway_svc.errors import APIError, unavailable
from protocol.client_messages import Health, ModelInfo
from protocol.metrics import QueueState, ServingMetrics

HEALTH_MAX_AGE_S = 0.25  # a worker that joins or leaves is seen within this


class Upstream:
    def __init__(self, client: AsyncClient, served_model_name: str | None = None, max_num_requests: int = 0,
                 limits: RequestLimits = RequestLimits(), chat_parsing: ChatParsing = ChatParsing()):
        self.client = client
        self.limits = limits  # what one request may ask, for every route and batch line
        self.chat_parsing = chat_parsing  # how chat outputs are parsed, for the route and batch lines
        self.served_model_name = served_model_name
        self.max_num_requests = max_num_requests  # 0: no bound
        self.num_requests = 0  # in flight through this gateway
        self.metrics = ServingMetrics(self.queue_state)
        self.disconnects = Disconnects(self.metrics.registry)
        self._health: Health | None = None
        self._health_time = 0.0
        self._health_query: asyncio.Future | None = None

    async def health(self, max_age_s: float = HEALTH_MAX_AGE_S) -> Health:
        """The scheduler's health, at most max_age_s old; concurrent callers share one query."""
        if self._health is not None and time.monotonic() - self._health_time <= max_age_s:
            return self._health
        if self._health_query is None:
            self._health_query = asyncio.ensure_future(self.client.health())
            self._health_query.add_done_callback(self._health_answered)
        health = await asyncio.shield(self._health_query)
        self._health, self._health_time = health, time.monotonic()
        return health

    def _health_answered(self, query: asyncio.Future) -> None:
        """The next caller asks again. The query's failure is its callers' to raise, and is read
        here in case every caller was cancelled (a client gone), so that none is left unretrieved."""
        self._health_query = None
        if not query.cancelled():
            query.exception()

    def queue_state(self) -> QueueState:
        """For /metrics, from the health the handler fetched just before rendering."""
        return QueueState() if self._health is None else QueueState.of(self._health)

    async def model(self) -> ModelInfo:
        info = await self.client.served_model()
        if info.model is None:
            raise unavailable("no worker has joined the scheduler yet; retry later", "no_worker")
        return info

    def name_of(self, info: ModelInfo) -> str:
        return self.served_model_name or info.model

    async def check_model(self, requested: str | None) -> ModelInfo:
        info = await self.model()
        if requested is not None and requested != self.name_of(info):
            raise APIError(404, f"The model `{requested}` does not exist; this server serves "
                                f"`{self.name_of(info)}`.", "model_not_found", param="model")
        return info

    async def admit(self) -> None:
        """Counts a request in flight (release() when it ends); 503 when no worker is joined or
        the gateway already has max_num_requests in flight."""
        if self.max_num_requests and self.num_requests >= self.max_num_requests:
            raise unavailable(f"the server is overloaded ({self.num_requests} requests in flight); retry later",
                              "overloaded")
        if (await self.health()).num_workers == 0:
            raise unavailable("no worker has joined the scheduler; retry later", "no_worker")
        self.num_requests += 1

    def release(self) -> None:
        self.num_requests -= 1
