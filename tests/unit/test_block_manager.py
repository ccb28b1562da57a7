import pytest

from protocol.sampling import SamplingParams
from scheduler_svc.block_manager import BlockManager, BlockPool
from scheduler_svc.request import Request


def make_request(num_tokens: int = 5, request_id: str = "r") -> Request:
    return Request(request_id, list(range(num_tokens)), SamplingParams())


def test_pool_allocates_from_the_free_list_and_counts_refs():
    pool = BlockPool(4)
    blocks = pool.allocate(3)
    assert blocks == [0, 1, 2] and pool.num_free == 1
    assert [pool.ref_count(b) for b in range(4)] == [1, 1, 1, 0]
    pool.free(blocks[:2])
    assert pool.num_free == 3 and pool.ref_count(0) == 0
    # Freed blocks go to the back: the oldest free block is reused first.
    assert pool.allocate(1) == [3]


def test_pool_double_free_and_over_allocation_assert():
    pool = BlockPool(2)
    blocks = pool.allocate(1)
    pool.free(blocks)
    with pytest.raises(AssertionError):
        pool.free(blocks)
    with pytest.raises(AssertionError):
        pool.allocate(3)


def test_allocate_and_append_grow_the_block_table_by_blocks_needed():
    manager = BlockManager(num_gpu_blocks=4, num_cpu_blocks=0, block_size=4)
    request = make_request(5)
    assert manager.num_missing_blocks(request, 5) == 2
    assert manager.allocate(request, 5) == [0, 1]
    assert manager.append(request, 8) == []  # still fits in two blocks
    assert manager.append(request, 9) == [2]
    assert request.block_ids == [0, 1, 2] and manager.num_free_blocks == 1
    assert manager.can_allocate(request, 16) and not manager.can_allocate(request, 17)
    with pytest.raises(AssertionError):
        manager.allocate(request, 1)  # already holds blocks
    manager.free(request)
    assert request.block_ids == [] and manager.num_free_blocks == 4
    manager.gpu.check_integrity([])


def test_swap_out_and_in_move_the_table_and_return_copy_pairs():
    manager = BlockManager(num_gpu_blocks=4, num_cpu_blocks=3, block_size=2)
    request = make_request(3)
    manager.allocate(request, 3)
    gpu_blocks = list(request.block_ids)
    assert manager.can_swap_out(request)
    pairs = manager.swap_out(request)
    assert [src for src, _ in pairs] == gpu_blocks
    assert request.block_ids == [dst for _, dst in pairs]
    assert manager.num_free_blocks == 4 and manager.cpu.num_free == 1
    manager.cpu.check_integrity(request.block_ids)
    assert manager.can_swap_in(request, 4) and not manager.can_swap_in(request, 9)
    cpu_blocks = list(request.block_ids)
    back = manager.swap_in(request)
    assert [src for src, _ in back] == cpu_blocks and request.block_ids == [dst for _, dst in back]
    assert manager.cpu.num_free == 3 and manager.num_free_blocks == 2
    manager.gpu.check_integrity(request.block_ids)


def test_swap_out_refused_when_cpu_pool_is_short():
    manager = BlockManager(num_gpu_blocks=4, num_cpu_blocks=1, block_size=2)
    request = make_request(4)
    manager.allocate(request, 4)
    assert not manager.can_swap_out(request)


def test_integrity_check_catches_leaks_and_double_ownership():
    pool = BlockPool(4)
    a = pool.allocate(2)
    pool.check_integrity(a)
    with pytest.raises(AssertionError, match="leak"):
        pool.check_integrity(a[:1])  # a block neither free nor owned
    with pytest.raises(AssertionError, match="ref count wrong"):
        pool.check_integrity(a + a[:1])  # owned twice, referenced once
    with pytest.raises(AssertionError):
        pool.check_integrity(a + [2])  # owned but on the free list
