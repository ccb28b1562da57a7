"""LiveChoices: the requests live on one client, as the scheduler sees them: one scheduler request
per choice (a prompt with n choices is n requests, `{request_id}-{index}`; the request id itself
when n is 1).

The one helper that stream, generate_batch and generate_iter share: `claim` makes the request's
id (when the caller gave none) and its choices' ids, claims them on the transport (a live id is
never taken twice) and registers each choice's sink; `forget` releases them once the request has
ended or its caller stopped listening (the caller aborts on the scheduler what had not finished);
`claimed` is `claim` for a request still being prepared, forgotten if its preparation fails.
"""
import contextlib
import itertools
import uuid
from typing import Callable, Iterator, Sequence

from client_sdk.transport import Sink, Transport
from protocol.sampling import SamplingParams


class LiveChoices:
    def __init__(self, transport: Transport):
        self._transport = transport
        self._ids = itertools.count()
        self._id_prefix = uuid.uuid4().hex[:12]
        self._choice_ids_of: dict[str, list[str]] = {}  # a live request with n > 1 -> its choices' ids

    def claim(self, request_id: str | None, params: SamplingParams, sink_of: Callable[[int], Sink]
              ) -> tuple[str, list[str]]:
        """The request's id (a new one when None) and its choices' ids, claimed, each choice's
        outputs going to sink_of(its index); ValueError when one is live already."""
        request_id = request_id or f"{self._id_prefix}-{next(self._ids)}"
        choice_ids = [request_id] if params.n == 1 else [f"{request_id}-{index}" for index in range(params.n)]
        self._transport.claim(choice_ids)
        if params.n > 1:
            self._choice_ids_of[request_id] = choice_ids
        sinks = self._transport.sinks
        for index, choice_id in enumerate(choice_ids):
            sinks[choice_id] = sink_of(index)
        return request_id, choice_ids

    @contextlib.contextmanager
    def claimed(self, request_id: str | None, params: SamplingParams, sink_of: Callable[[int], Sink]
                ) -> Iterator[tuple[str, list[str]]]:
        """claim's (request id, choice ids) for the block; forgotten if the block raises, else
        the caller's to forget once the request ends."""
        request_id, choice_ids = self.claim(request_id, params, sink_of)
        try:
            yield request_id, choice_ids
        except BaseException:
            self.forget(request_id, choice_ids)
            raise

    def forget(self, request_id: str, choice_ids: list[str]) -> None:
        sinks = self._transport.sinks
        for choice_id in choice_ids:
            sinks.pop(choice_id, None)
        self._choice_ids_of.pop(request_id, None)

    def scheduler_ids(self, request_ids: Sequence[str]) -> list[str]:
        """The scheduler's ids of these requests (each choice's), for an abort."""
        return [choice_id for rid in request_ids for choice_id in self._choice_ids_of.get(rid, (rid,))]
