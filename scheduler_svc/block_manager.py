"""Block tables of requests over a device pool and a CPU (swap) pool, and the prefix cache.

The device pool holds the KV the worker computes; the CPU pool holds KV of swapped-out
requests. A request's `block_ids` lists device blocks while it waits or runs, CPU blocks while
swapped. Nothing here scans all blocks except `check_integrity`, which runs when idle.

Prefix caching (device pool only). A full block becomes cacheable once the step that computed
its last token has been applied (`cache_computed_blocks`, from the core's update()); it is then
known by its chained hash (scheduler_svc.block_hash) and stays so after its request frees it,
as an evictable block, until the memory is needed. A request being admitted looks up its full
blocks from the front (`find_cached_prefix`, O(blocks found + 1)), shares the ones found and
computes from the first miss. Only full, computed blocks are ever shared and a request writes
only past its computed tokens, so no one writes into a shared block, with one exception: when
every token is found, the last one is computed again for its logits, into a private copy of
the last block (copy-on-write: a `blocks_to_copy` pair in the plan).

Cached only once computed: blocks are never registered at planning time, so a failed step or a
lost worker never leaves a block cached whose KV was not written; with async scheduling the rule
stays in update(). So that a burst of prompts sharing a prefix does not compute it once per prompt
admitted before the first one's step is applied, the manager also knows the full prompt blocks
that admitted requests are computing now (`computes_shared_run`): the core holds back a prompt
whose next MIN_SHARED_TOKENS are among them for the step or two until they are cached. Shorter
runs are computed again: a step or two of latency would cost more than they spare.
"""
from scheduler_svc.block_hash import block_hash
from scheduler_svc.block_pool import BlockPool
from scheduler_svc.request import Request

__all__ = ["BlockManager", "BlockPool", "CachedPrefix"]

# The prompt tokens past its cached prefix that a request waits a step or two for, if another
# request is computing them, rather than computing them again (a prefill chunk's worth on a CPU).
MIN_SHARED_TOKENS = 256


class CachedPrefix:
    """What a lookup found for a request: the blocks to share and the tokens they spare it."""

    __slots__ = ("block_ids", "num_computed_tokens", "copy_last")

    def __init__(self, block_ids: list[int], num_computed_tokens: int, copy_last: bool):
        self.block_ids = block_ids  # device blocks holding its leading full blocks' KV
        self.num_computed_tokens = num_computed_tokens  # where its computation starts
        self.copy_last = copy_last  # every token found: the last block is copied, not shared


NO_PREFIX = CachedPrefix([], 0, False)


class BlockManager:
    def __init__(self, num_gpu_blocks: int, num_cpu_blocks: int, block_size: int,
                 enable_prefix_caching: bool = False):
        self.block_size = block_size
        self.gpu = BlockPool(num_gpu_blocks)
        self.cpu = BlockPool(num_cpu_blocks)
        self.enable_prefix_caching = enable_prefix_caching
        # Sources of the copy-on-write pairs of the plan in flight: referenced until its update(),
        # so no allocation can hand them out before the worker has copied them.
        self._copy_sources: list[int] = []
        # For health(): prompt (and resumed) tokens looked up on admission, and those found.
        self.num_prefix_cache_queries = 0
        self.num_prefix_cache_hits = 0
        # hash of a full block an admitted request is computing, not cached yet -> that request
        self._computing: dict[bytes, Request] = {}

    @property
    def num_free_blocks(self) -> int:
        return self.gpu.num_free

    @property
    def num_total_blocks(self) -> int:
        return self.gpu.num_blocks

    @property
    def num_cached_blocks(self) -> int:
        return self.gpu.num_cached

    def num_blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def num_missing_blocks(self, request: Request, num_tokens: int) -> int:
        """Device blocks `request` lacks to hold its first num_tokens tokens."""
        return max(0, self.num_blocks_for(num_tokens) - len(request.block_ids))

    def can_allocate(self, request: Request, num_tokens: int) -> bool:
        return self.num_missing_blocks(request, num_tokens) <= self.gpu.num_free

    # ---- admission -----------------------------------------------------------------------

    def shares_prefix(self, request: Request) -> bool:
        """Whether the request takes part in the prefix cache: not when caching is off, nor when it
        asks for prompt logprobs (cached blocks hold KV, not the logits it needs)."""
        return self.enable_prefix_caching and request.params.prompt_logprobs is None

    def find_cached_prefix(self, request: Request) -> CachedPrefix:
        """The longest run of the request's leading full blocks whose KV the cache holds.
        O(blocks found + 1); takes no reference, so it may be asked again next step. A request
        asking for prompt logprobs finds none: cached blocks hold KV, not the logits it needs."""
        if not self.shares_prefix(request):
            return NO_PREFIX
        block_size, num_tokens = self.block_size, request.num_tokens
        block_ids = []
        for index in range(num_tokens // block_size):
            block_id = self.gpu.cached_block(block_hash(request, index, block_size))
            if block_id is None:
                break
            block_ids.append(block_id)
        num_found = len(block_ids) * block_size
        # Every token found: compute the last one again, for its logits.
        return CachedPrefix(block_ids, min(num_found, num_tokens - 1), num_found == num_tokens)

    def computes_shared_run(self, request: Request, prefix: CachedPrefix) -> bool:
        """Whether admitted requests are computing the next MIN_SHARED_TOKENS (in full blocks) of
        the request past the prefix found: admitted now, it would compute them again. Hashes are
        chained, so the run's last block alone says so. O(blocks of the run), each hashed once."""
        last = len(prefix.block_ids) + max(1, MIN_SHARED_TOKENS // self.block_size) - 1
        if not self._computing or (last + 1) * self.block_size > request.num_tokens:
            return False
        return self.shares_prefix(request) and block_hash(request, last, self.block_size) in self._computing

    def can_admit(self, request: Request, prefix: CachedPrefix, num_tokens: int) -> bool:
        """Room for the first num_tokens tokens, counting the found blocks that are evictable now
        (sharing them takes them out of the free count) and the copy-on-write block."""
        num_shared = len(prefix.block_ids) - prefix.copy_last
        num_new = self.num_blocks_for(num_tokens) - num_shared
        return num_new + self.gpu.num_evictable_among(prefix.block_ids) <= self.gpu.num_free

    def admit(self, request: Request, prefix: CachedPrefix, num_tokens: int) -> list[tuple[int, int]]:
        """Blocks of a request being admitted: the found prefix shared, fresh blocks up to
        num_tokens tokens. Returns the plan's copy-on-write pairs (src, dst)."""
        assert not request.block_ids, f"{request.request_id} already holds blocks"
        if prefix.block_ids:
            self.num_prefix_cache_hits += prefix.num_computed_tokens
        if self.enable_prefix_caching:
            self.num_prefix_cache_queries += request.num_tokens
        shared = prefix.block_ids
        # Share before allocating: an allocation may otherwise evict a block just found.
        self.gpu.share(shared)
        copies = []
        if prefix.copy_last:
            source = shared[-1]
            self._copy_sources.append(source)  # its reference is released in release_copy_sources
            shared = shared[:-1]
            [copy] = self.gpu.allocate(1)
            copies.append((source, copy))
            request.block_ids = shared + [copy]
        else:
            request.block_ids = list(shared)
        request.num_cached_blocks = len(shared)
        self.append(request, num_tokens)
        if self.shares_prefix(request):
            for index in range(len(prefix.block_ids), request.num_tokens // self.block_size):
                self._computing.setdefault(block_hash(request, index, self.block_size), request)
        return copies

    def release_copy_sources(self) -> None:
        """The plan in flight was applied: the worker has made its copies."""
        if self._copy_sources:
            self.gpu.free(self._copy_sources)
            self._copy_sources = []

    def cache_computed_blocks(self, request: Request) -> None:
        """Offer the request's newly full, computed blocks to the cache. O(1) unless a block
        filled up since the last call (then one hash per such block)."""
        num_full = request.num_computed_tokens // self.block_size
        if num_full <= request.num_cached_blocks or not self.enable_prefix_caching:
            return
        block_ids, block_size = request.block_ids, self.block_size
        for index in range(request.num_cached_blocks, num_full):
            known = block_hash(request, index, block_size)
            self.gpu.cache(block_ids[index], known)
            if self._computing.get(known) is request:
                del self._computing[known]
        request.num_cached_blocks = num_full

    # ---- growing, freeing, swapping --------------------------------------------------------

    def allocate(self, request: Request, num_tokens: int) -> list[int]:
        """First blocks of a request being admitted, without a cache lookup."""
        assert not request.block_ids, f"{request.request_id} already holds blocks"
        return self.append(request, num_tokens)

    def append(self, request: Request, num_tokens: int) -> list[int]:
        """Grow the block table to hold num_tokens tokens; returns the blocks added."""
        new_block_ids = self.gpu.allocate(self.num_missing_blocks(request, num_tokens))
        request.block_ids.extend(new_block_ids)
        return new_block_ids

    def free(self, request: Request, on_cpu: bool = False) -> None:
        self._stop_computing(request)
        # Tail first: the blocks of a prefix's end are the first evicted, its head the last,
        # since a cached block is only reachable through the blocks before it.
        (self.cpu if on_cpu else self.gpu).free(reversed(request.block_ids))
        request.block_ids = []
        request.num_blocks_sent = 0
        request.num_cached_blocks = 0

    def _stop_computing(self, request: Request) -> None:
        """The request computes no more blocks here (freed, preempted, swapped out)."""
        if not self._computing or request.block_hashes is None:
            return
        for known in request.block_hashes[request.num_cached_blocks:]:
            if self._computing.get(known) is request:
                del self._computing[known]

    def drop_cache(self) -> None:
        """The worker and its KV are gone: nothing cached may be found again."""
        self.release_copy_sources()
        self.gpu.drop_cache()
        self._computing.clear()

    def can_swap_out(self, request: Request) -> bool:
        return len(request.block_ids) <= self.cpu.num_free

    def swap_out(self, request: Request) -> list[tuple[int, int]]:
        """Move the block table to CPU; returns (gpu, cpu) copy pairs for the worker. Shared and
        cached blocks are copied like any other; on the device they stay cached (evictable once
        no one else holds them)."""
        self._stop_computing(request)
        return self._move(request, self.gpu, self.cpu)

    def can_swap_in(self, request: Request, num_tokens: int) -> bool:
        return max(len(request.block_ids), self.num_blocks_for(num_tokens)) <= self.gpu.num_free

    def swap_in(self, request: Request) -> list[tuple[int, int]]:
        """Move the block table back to the device into fresh blocks; returns (cpu, gpu) copy
        pairs. The next update() offers them to the cache again (a copy still cached on the
        device keeps its place, the swapped-in one stays private)."""
        return self._move(request, self.cpu, self.gpu)

    @staticmethod
    def _move(request: Request, src: "BlockPool", dst: "BlockPool") -> list[tuple[int, int]]:
        dst_block_ids = dst.allocate(len(request.block_ids))
        pairs = list(zip(request.block_ids, dst_block_ids))
        src.free(reversed(request.block_ids))
        request.block_ids = dst_block_ids
        request.num_blocks_sent = 0  # the worker learns the whole new table again
        request.num_cached_blocks = 0  # CPU blocks are never cached; re-offered after swap-in
        return pairs

    def check_integrity(self, running: list[Request], swapped: list[Request], plan_in_flight: bool) -> None:
        """O(all blocks + blocks of running requests): idle checks and tests."""
        assert plan_in_flight or not self._copy_sources, "copy sources outlived their plan"
        owned = [b for r in running for b in r.block_ids] + self._copy_sources
        self.gpu.check_integrity(owned)
        self.cpu.check_integrity([b for r in swapped for b in r.block_ids])
        running_ids = {id(r) for r in running}
        for known, request in self._computing.items():
            assert id(request) in running_ids, f"{request} is not running but computes a block for the cache"
            assert known in request.block_hashes[request.num_cached_blocks:], f"{request} computes no such block"
        for request in running:
            assert request.num_cached_blocks <= len(request.block_ids)
            assert request.num_cached_blocks * self.block_size <= request.num_computed_tokens
            for index in range(request.num_cached_blocks):
                known = self.gpu.hash_of(request.block_ids[index])
                assert known is None or known == request.block_hashes[index], (
                    f"{request} holds block {request.block_ids[index]} cached for other tokens")
