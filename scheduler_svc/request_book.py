"""RequestBook: the service's index of live requests, by id and by client.

Where a live request is has one owner each: `pending` (the service's queue) until a replica's
core takes it, then that core (its waiting, running and swapped queues). This book owns only
what neither knows: is this id live anywhere, and which requests die with a vanished client.
"""
from collections import defaultdict

from scheduler_svc.request import Request


class RequestBook:
    def __init__(self):
        self._requests: dict[str, Request] = {}
        self._ids_of_client: dict[bytes, set[str]] = defaultdict(set)
        self.num_finished = 0

    def __len__(self) -> int:
        return len(self._requests)

    def ids(self) -> list[str]:
        return list(self._requests)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._requests

    def get(self, request_id: str) -> Request | None:
        return self._requests.get(request_id)

    def add(self, request: Request) -> None:
        assert request.request_id not in self._requests, "one live request per id"
        self._requests[request.request_id] = request
        self._ids_of_client[request.client].add(request.request_id)

    def ids_of(self, client: bytes) -> list[str]:
        return list(self._ids_of_client.get(client, ()))

    def forget(self, request: Request) -> None:
        """The request ended: no longer live, counted as finished."""
        del self._requests[request.request_id]
        ids = self._ids_of_client.get(request.client)
        if ids is not None:
            ids.discard(request.request_id)
            if not ids:
                del self._ids_of_client[request.client]
        self.num_finished += 1
