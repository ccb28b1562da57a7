"""Routing: which replica takes a request that waits in `pending`.

Replicas pull their work: one with room refills its core from the front of `pending`
(step_loop.py), so balancing by load needs no decision (`--routing load`). `--routing prefix`
(the default) adds one at that moment: the request goes to the replica whose prefix cache holds
the longest run of its leading blocks, unless that replica is already much busier than the one
refilling; then the refilling one takes it and computes the prefix itself, so a hot prefix
spreads over replicas instead of starving their neighbours (the cache-aware policy with a
load-balance threshold of SGLang's router). A request routed away waits in that replica's own
queue here, which its next refill takes together with `pending`, in arrival (or priority) order.

Exact, not an approximate tree kept beside the caches: each core's block pool is the one record
of what its replica caches (the core plans every allocation and eviction), so the lookup asks the
pools: O(prompt blocks) per replica, with hashes the chosen core reuses when it admits the
request. An evicted block is no longer found; a dropped replica is no longer asked, and what was
routed to it goes back to `pending`.

A burst of prompts sharing a prefix none caches yet would each start computing it on whichever
replica refills: so the router remembers, for the first block a routed request's replica lacks,
that the replica will compute it (a bounded LRU of block hashes), and sends the next prompt needing
that block there too, within the same balance bound. The prefix is then computed once, not once
per replica. A prompt whose first block no replica caches or computes goes to the least loaded
one, as in SGLang's router below its match threshold: else a burst of new prefixes would all start
on the replica that refills first, up to its watermark, and stay there. Load is counted in
requests (waiting, running, routed), not tokens: a request whose prefix is cached costs its
replica only its suffix.
"""
from collections import OrderedDict

from scheduler_svc.block_hash import block_hash
from scheduler_svc.config import SchedulerConfig
from scheduler_svc.replica import Replica
from scheduler_svc.request import Request
from scheduler_svc.waiting_queue import make_waiting_queue

# A replica holding a prompt's prefix takes it while it holds at most this many requests more
# than the refilling one, or at most this factor of them (SGLang's router balances likewise).
BALANCE_ABS_THRESHOLD = 32
BALANCE_REL_THRESHOLD = 1.5
# Blocks remembered as about to be computed on a replica: a burst's distinct prefixes, many times.
NUM_PROMISED_BLOCKS = 8192


class Router:
    def __init__(self, config: SchedulerConfig):
        self.by_prefix = config.routing == "prefix"
        self._policy = config.policy
        self._queues: dict[str, object] = {}  # replica name -> its waiting queue of requests routed to it
        self._routed_to: dict[str, str] = {}  # request id -> replica name, while it waits routed
        # hash of a block not cached anywhere yet -> the replica a request needing it went to
        self._promised: OrderedDict[bytes, str] = OrderedDict()

    def __len__(self) -> int:
        return len(self._routed_to)

    def queue_of(self, replica: Replica):
        queue = self._queues.get(replica.name)
        if queue is None:
            queue = self._queues[replica.name] = make_waiting_queue(self._policy)
        return queue

    def next_for(self, replica: Replica, pending):
        """(the request the replica takes next, the queue it is at the front of): the earlier of
        its routed queue's front and pending's; (None, None) when both are empty."""
        routed = self._queues.get(replica.name)
        first = routed.peek() if routed else None
        other = pending.peek()
        if first is None:
            return (other, pending) if other is not None else (None, None)
        if other is None or self._order(first) <= self._order(other):
            return first, routed
        return other, pending

    def _order(self, request: Request):
        return (request.priority, request.arrival) if self._policy == "priority" else request.arrival

    def destination(self, request: Request, refilling: Replica, replicas) -> Replica:
        """Where a request from `pending` goes when `refilling` asks for work: the replica caching
        the most of its leading blocks, more than the refilling one (or as many and computing the
        next one already; the least loaded when none caches or computes its first block), and not
        past the balance threshold; else the refilling replica. O(replicas x prompt blocks)."""
        if not self.by_prefix or not refilling.core.enable_prefix_caching:
            return refilling
        block_size = refilling.core.capacity.block_size
        found = {refilling.name: self._num_cached_blocks(refilling, request)}
        candidates = {refilling.name: refilling}
        best = refilling
        for replica in replicas:
            if (replica is refilling or not replica.alive or not replica.is_complete
                    or not replica.core.enable_prefix_caching
                    or replica.core.capacity.block_size != block_size):  # hashes are per block size
                continue
            num_blocks = found[replica.name] = self._num_cached_blocks(replica, request)
            candidates[replica.name] = replica
            if num_blocks > found[best.name] or (num_blocks == found[best.name] and best is not refilling
                                                 and self.load(replica) < self.load(best)):
                best = replica
        num_blocks = found[best.name]
        next_block = (block_hash(request, num_blocks, block_size)
                      if (num_blocks + 1) * block_size <= request.num_tokens
                      and refilling.core.block_manager.shares_prefix(request) else None)
        if next_block is not None:
            promised = self._promised.get(next_block)
            if promised is not None and found.get(promised) == num_blocks:
                best = candidates[promised]
            elif num_blocks == 0:
                best = min(candidates.values(), key=lambda replica: (self.load(replica), replica is not refilling))
        if best is not refilling and not self._within_balance(best, refilling):
            best = refilling
        if next_block is not None:
            self._promise(next_block, best)
        return best

    def _num_cached_blocks(self, replica: Replica, request: Request) -> int:
        return len(replica.core.block_manager.find_cached_prefix(request).block_ids)

    def _promise(self, block: bytes, replica: Replica) -> None:
        self._promised[block] = replica.name
        self._promised.move_to_end(block)
        if len(self._promised) > NUM_PROMISED_BLOCKS:
            self._promised.popitem(last=False)

    def load(self, replica: Replica) -> int:
        """Requests the replica holds or has been routed."""
        core = replica.core
        routed = self._queues.get(replica.name)
        return core.num_waiting + core.num_running + core.num_swapped + (len(routed) if routed else 0)

    def _within_balance(self, cached: Replica, refilling: Replica) -> bool:
        cached_load, refilling_load = self.load(cached), self.load(refilling)
        return (cached_load - refilling_load <= BALANCE_ABS_THRESHOLD
                or cached_load <= BALANCE_REL_THRESHOLD * refilling_load)

    def send(self, request: Request, replica: Replica) -> None:
        """The request, just taken from `pending`, waits for `replica`'s next refill."""
        self.queue_of(replica).push(request)
        self._routed_to[request.request_id] = replica.name
        replica.num_routed_by_prefix += 1
        replica.wakeup.set()

    def taken(self, request: Request, queue) -> None:
        """The front of `queue` (from next_for) entered its replica's core."""
        queue.pop()
        self._routed_to.pop(request.request_id, None)

    def remove(self, request: Request) -> bool:
        """A request that ended while routed is skipped by its queue; False if it was not routed."""
        name = self._routed_to.pop(request.request_id, None)
        if name is None:
            return False
        self._queues[name].mark_removed()
        return True

    def forget(self, replica: Replica) -> list[Request]:
        """A dropped replica's routed requests, in the order they would have run."""
        queue = self._queues.pop(replica.name, None)
        requests = queue.drain() if queue is not None else []
        for request in requests:
            del self._routed_to[request.request_id]
        for block in [block for block, name in self._promised.items() if name == replica.name]:
            del self._promised[block]
        return requests
