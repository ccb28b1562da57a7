"""request_timeout_s: every request that has not finished that long after it was sent fails with
a `timeout` error (and is aborted on the scheduler), so a hung or unreachable scheduler never
means an endless wait.

One timeout for all requests, so deadlines come in send order: one deque and one task, no timer
per request, and a million requests in flight cost one small entry each.
"""
import asyncio
from collections import deque
from typing import Callable


class Deadlines:
    def __init__(self, timeout_s: float, on_expired: Callable[[list[tuple[str, object]]], None]):
        """on_expired: called with (request_id, sink) pairs whose time is up; the caller checks
        that the sink still serves that id (an id may be reused after it finished)."""
        self.timeout_s = timeout_s
        self._on_expired = on_expired
        self._entries: deque[tuple[float, str, object]] = deque()
        self._added = asyncio.Event()

    def add(self, entries: list[tuple[str, object]]) -> None:
        deadline = asyncio.get_running_loop().time() + self.timeout_s
        self._entries.extend((deadline, request_id, sink) for request_id, sink in entries)
        self._added.set()

    async def run(self) -> None:
        loop, entries = asyncio.get_running_loop(), self._entries
        while True:
            if not entries:
                self._added.clear()
                await self._added.wait()
                continue
            delay = entries[0][0] - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            now, expired = loop.time(), []
            while entries and entries[0][0] <= now:
                _, request_id, sink = entries.popleft()
                expired.append((request_id, sink))
            if expired:
                self._on_expired(expired)
