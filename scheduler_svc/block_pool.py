"""One pool of KV block ids: ref counts, a free list, and the prefix cache over the same blocks.

A block is in exactly one of three states:
    in use      ref count > 0; held by one request, or shared by several (a cached prefix)
    evictable   ref count 0 but still holding the KV of a full block, known by its hash;
                kept in LRU order, taken back by a request whose prefix matches, or evicted
                (its hash forgotten) when the pool runs out of truly free blocks
    free        ref count 0, no hash: contents are garbage
Evictable blocks count as free for capacity: allocating never fails while free + evictable
blocks suffice. Every operation costs O(blocks it is given); only check_integrity scans all.
"""
from collections import Counter, OrderedDict, deque


class BlockPool:
    __slots__ = ("num_blocks", "_free", "_evictable", "_ref_counts", "_hash_of", "_block_of_hash")

    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self._free = deque(range(num_blocks))  # FIFO: the oldest free block is reused first
        self._evictable: OrderedDict[int, None] = OrderedDict()  # LRU first
        self._ref_counts = [0] * num_blocks
        self._hash_of: list[bytes | None] = [None] * num_blocks
        self._block_of_hash: dict[bytes, int] = {}

    @property
    def num_free(self) -> int:
        """Blocks an allocation may take: the truly free and the evictable."""
        return len(self._free) + len(self._evictable)

    @property
    def num_cached(self) -> int:
        """Blocks known by their hash, in use or evictable."""
        return len(self._block_of_hash)

    def ref_count(self, block_id: int) -> int:
        return self._ref_counts[block_id]

    def allocate(self, num_blocks: int) -> list[int]:
        """Fresh blocks, ref count 1: truly free ones first, then the least recently used cached."""
        assert num_blocks <= self.num_free, "allocate past the free blocks"
        ref_counts = self._ref_counts
        block_ids = []
        for _ in range(num_blocks):
            if self._free:
                block_id = self._free.popleft()
            else:
                block_id, _ = self._evictable.popitem(last=False)
                del self._block_of_hash[self._hash_of[block_id]]  # its KV is about to be overwritten
                self._hash_of[block_id] = None
            # NOTE: a free or evictable block is owned by no one.
            assert ref_counts[block_id] == 0, f"block {block_id} was free but referenced"
            ref_counts[block_id] = 1
            block_ids.append(block_id)
        return block_ids

    def free(self, block_ids) -> None:
        """Drop one reference each, in the order given: cached blocks freed last are evicted last."""
        ref_counts = self._ref_counts
        for block_id in block_ids:
            assert ref_counts[block_id] > 0, f"block {block_id} freed twice"
            ref_counts[block_id] -= 1
            if ref_counts[block_id] == 0:
                if self._hash_of[block_id] is None:
                    self._free.append(block_id)
                else:
                    self._evictable[block_id] = None

    # ---- the prefix cache --------------------------------------------------------------

    def cached_block(self, block_hash: bytes) -> int | None:
        """The block holding the KV that `block_hash` names, if any. Takes no reference."""
        return self._block_of_hash.get(block_hash)

    def share(self, block_ids: list[int]) -> None:
        """Take one more reference to each (cached) block; an evictable one is in use again."""
        ref_counts, evictable = self._ref_counts, self._evictable
        for block_id in block_ids:
            assert self._hash_of[block_id] is not None, f"block {block_id} is shared but not cached"
            if ref_counts[block_id] == 0:
                del evictable[block_id]
            ref_counts[block_id] += 1

    def hash_of(self, block_id: int) -> bytes | None:
        return self._hash_of[block_id]

    def num_evictable_among(self, block_ids: list[int]) -> int:
        """How many of these cached blocks taking a reference would remove from num_free."""
        ref_counts = self._ref_counts
        return sum(1 for block_id in block_ids if ref_counts[block_id] == 0)

    def cache(self, block_id: int, block_hash: bytes) -> None:
        """Name a full, computed block by its hash. If another block already holds that KV, the
        first stays the cached one and this block remains private (freed without a hash)."""
        assert self._ref_counts[block_id] > 0, f"block {block_id} cached while free"
        known = self._hash_of[block_id]
        if known is not None:
            assert known == block_hash, f"block {block_id} cached under two hashes"
            return
        if block_hash not in self._block_of_hash:
            self._block_of_hash[block_hash] = block_id
            self._hash_of[block_id] = block_hash

    def drop_cache(self) -> None:
        """Forget every hash (the KV they named is gone: a dead worker). O(cached blocks)."""
        for block_id in self._block_of_hash.values():
            self._hash_of[block_id] = None
        self._block_of_hash.clear()
        self._free.extend(self._evictable)
        self._evictable.clear()

    def check_integrity(self, owned: list[int]) -> None:
        """owned: every block id some holder references, once per reference (a block shared by
        three requests is listed three times). O(num_blocks): for idle checks and tests."""
        free, evictable = set(self._free), set(self._evictable)
        assert len(free) == len(self._free), "a block is on the free list twice"
        refs = Counter(owned)
        assert not free & evictable, "a block is both free and evictable"
        assert not (free | evictable) & refs.keys(), "a block is both free and owned"
        assert len(free) + len(evictable) + len(refs) == self.num_blocks, (
            f"leak: {len(free)} free + {len(evictable)} evictable + {len(refs)} in use "
            f"!= {self.num_blocks} total")
        for block_id in range(self.num_blocks):
            assert self._ref_counts[block_id] == refs.get(block_id, 0), f"block {block_id} ref count wrong"
        for block_id in free:
            assert self._hash_of[block_id] is None, f"free block {block_id} keeps a hash"
        for block_id in evictable:
            assert self._hash_of[block_id] is not None, f"evictable block {block_id} has no hash"
        for block_hash, block_id in self._block_of_hash.items():
            assert self._hash_of[block_id] == block_hash, f"block {block_id} and its hash disagree"
        assert sum(h is not None for h in self._hash_of) == len(self._block_of_hash), "a hash is lost"
