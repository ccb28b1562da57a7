"""Waiting queues: FCFS (a deque) and priority (a heap), both with lazy removal.

An abort in waiting only marks the request finished (the scheduler sets its status); the
entry is skipped when it reaches the front. So abort is O(1) and a step never scans the
queue. When dead entries outnumber live ones the queue is compacted once (amortised O(1) per
abort), so a mass abort does not keep a million dead requests alive.
"""
import heapq
from collections import deque

from scheduler_svc.request import Request

_COMPACT_MIN_DEAD = 4096


class FcfsQueue:
    def __init__(self):
        self._queue: deque[Request] = deque()
        self._num_dead = 0

    def __len__(self) -> int:
        return len(self._queue) - self._num_dead

    def push(self, request: Request) -> None:
        self._queue.append(request)

    def push_front(self, request: Request) -> None:
        """A request preempted by recompute goes back ahead of every other waiting one."""
        self._queue.appendleft(request)

    def peek(self) -> Request | None:
        queue = self._queue
        while queue and queue[0].is_finished:
            queue.popleft()
            self._num_dead -= 1
        return queue[0] if queue else None

    def pop(self) -> Request:
        request = self.peek()
        assert request is not None, "pop from an empty waiting queue"
        return self._queue.popleft()

    def mark_removed(self) -> None:
        """One live entry was finished in place (aborted); skip it later."""
        self._num_dead += 1
        if self._num_dead > _COMPACT_MIN_DEAD and self._num_dead > len(self._queue) // 2:
            self._queue = deque(r for r in self._queue if not r.is_finished)
            self._num_dead = 0

    def drain(self) -> list[Request]:
        """Every live request, in queue order; the queue is left empty."""
        live = [r for r in self._queue if not r.is_finished]
        self._queue.clear()
        self._num_dead = 0
        return live

    def live_requests(self) -> list[Request]:
        return [r for r in self._queue if not r.is_finished]


class PriorityQueue:
    """Lower `priority` value first (vLLM's convention); ties in arrival order (request.arrival,
    numbered as it is made)."""

    def __init__(self):
        self._heap: list[tuple[int, int, Request]] = []
        self._num_dead = 0

    def __len__(self) -> int:
        return len(self._heap) - self._num_dead

    def push(self, request: Request) -> None:
        heapq.heappush(self._heap, (request.priority, request.arrival, request))

    # A preempted request keeps its key: it arrived early, so it sorts ahead of later equals.
    push_front = push

    def peek(self) -> Request | None:
        heap = self._heap
        while heap and heap[0][2].is_finished:
            heapq.heappop(heap)
            self._num_dead -= 1
        return heap[0][2] if heap else None

    def pop(self) -> Request:
        request = self.peek()
        assert request is not None, "pop from an empty waiting queue"
        return heapq.heappop(self._heap)[2]

    def mark_removed(self) -> None:
        self._num_dead += 1
        if self._num_dead > _COMPACT_MIN_DEAD and self._num_dead > len(self._heap) // 2:
            self._heap = [e for e in self._heap if not e[2].is_finished]
            heapq.heapify(self._heap)
            self._num_dead = 0

    def drain(self) -> list[Request]:
        live = sorted((e for e in self._heap if not e[2].is_finished), key=lambda e: e[:2])
        self._heap = []
        self._num_dead = 0
        return [e[2] for e in live]

    def live_requests(self) -> list[Request]:
        return [e[2] for e in self._heap if not e[2].is_finished]


def make_waiting_queue(policy: str):
    return PriorityQueue() if policy == "priority" else FcfsQueue()
