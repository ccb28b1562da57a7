"""Fixed-size KV blocks: a free list and ref counts per pool, block tables on the requests.

The device pool holds the KV the worker computes; the CPU pool holds KV of swapped-out
requests. Nothing here scans all blocks except `check_integrity`, which runs when idle.
A request's `block_ids` lists device blocks while it waits or runs, CPU blocks while swapped.
"""
from collections import deque

from scheduler_svc.request import Request


class BlockPool:
    """One pool of block ids with a FIFO free list and a ref count per block."""

    __slots__ = ("num_blocks", "_free", "_ref_counts")

    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self._free = deque(range(num_blocks))
        self._ref_counts = [0] * num_blocks

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self, num_blocks: int) -> list[int]:
        assert num_blocks <= len(self._free), "allocate past the free list"
        popleft = self._free.popleft
        ref_counts = self._ref_counts
        block_ids = [popleft() for _ in range(num_blocks)]
        for block_id in block_ids:
            # NOTE: a block on the free list is owned by no one.
            assert ref_counts[block_id] == 0, f"block {block_id} was free but referenced"
            ref_counts[block_id] = 1
        return block_ids

    def free(self, block_ids: list[int]) -> None:
        ref_counts = self._ref_counts
        for block_id in block_ids:
            assert ref_counts[block_id] > 0, f"block {block_id} freed twice"
            ref_counts[block_id] -= 1
            if ref_counts[block_id] == 0:
                self._free.append(block_id)

    def ref_count(self, block_id: int) -> int:
        return self._ref_counts[block_id]

    def check_integrity(self, owned: list[int]) -> None:
        """owned: every block id some request holds. O(num_blocks): for idle checks and tests."""
        free = set(self._free)
        assert len(free) == len(self._free), "a block is on the free list twice"
        owned_set = set(owned)
        assert len(owned_set) == len(owned), "a block is owned twice"
        assert not free & owned_set, "a block is both free and owned"
        assert len(free) + len(owned_set) == self.num_blocks, (
            f"leak: {len(free)} free + {len(owned_set)} in use != {self.num_blocks} total")
        for block_id in owned_set:
            assert self._ref_counts[block_id] == 1, f"block {block_id} ref count wrong"


class BlockManager:
    """Block tables of requests over a device pool and a CPU (swap) pool."""

    def __init__(self, num_gpu_blocks: int, num_cpu_blocks: int, block_size: int):
        self.block_size = block_size
        self.gpu = BlockPool(num_gpu_blocks)
        self.cpu = BlockPool(num_cpu_blocks)

    @property
    def num_free_blocks(self) -> int:
        return self.gpu.num_free

    @property
    def num_total_blocks(self) -> int:
        return self.gpu.num_blocks

    def num_blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def num_missing_blocks(self, request: Request, num_tokens: int) -> int:
        """Device blocks `request` lacks to hold its first num_tokens tokens."""
        return max(0, -(-num_tokens // self.block_size) - len(request.block_ids))

    def can_allocate(self, request: Request, num_tokens: int) -> bool:
        return self.num_missing_blocks(request, num_tokens) <= self.gpu.num_free

    def allocate(self, request: Request, num_tokens: int) -> list[int]:
        """First blocks of a request being admitted: enough for its first num_tokens tokens."""
        assert not request.block_ids, f"{request.request_id} already holds blocks"
        return self.append(request, num_tokens)

    def append(self, request: Request, num_tokens: int) -> list[int]:
        """Grow the block table to hold num_tokens tokens; returns the blocks added."""
        new_block_ids = self.gpu.allocate(self.num_missing_blocks(request, num_tokens))
        request.block_ids.extend(new_block_ids)
        return new_block_ids

    def free(self, request: Request, on_cpu: bool = False) -> None:
        (self.cpu if on_cpu else self.gpu).free(request.block_ids)
        request.block_ids = []
        request.num_blocks_sent = 0

    def can_swap_out(self, request: Request) -> bool:
        return len(request.block_ids) <= self.cpu.num_free

    def swap_out(self, request: Request) -> list[tuple[int, int]]:
        """Move the block table to CPU; returns (gpu, cpu) copy pairs for the worker."""
        return self._move(request, self.gpu, self.cpu)

    def can_swap_in(self, request: Request, num_tokens: int) -> bool:
        return max(len(request.block_ids), self.num_blocks_for(num_tokens)) <= self.gpu.num_free

    def swap_in(self, request: Request) -> list[tuple[int, int]]:
        """Move the block table back to the device; returns (cpu, gpu) copy pairs."""
        return self._move(request, self.cpu, self.gpu)

    @staticmethod
    def _move(request: Request, src: "BlockPool", dst: "BlockPool") -> list[tuple[int, int]]:
        dst_block_ids = dst.allocate(len(request.block_ids))
        pairs = list(zip(request.block_ids, dst_block_ids))
        src.free(request.block_ids)
        request.block_ids = dst_block_ids
        request.num_blocks_sent = 0  # the worker learns the whole new table again
        return pairs
