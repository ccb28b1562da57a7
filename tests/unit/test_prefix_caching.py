"""Prefix caching in the scheduler core and its block pool, one behaviour per test.

The fake worker mirrors KV contents (tests/scheduler_fakes.py), so every test here also checks
that each request reads the KV of its own tokens and writes only into blocks it holds alone.
"""
import pytest

from scheduler_svc import block_hash as block_hash_module
from scheduler_svc import block_manager as block_manager_module
from scheduler_svc.block_manager import BlockManager
from scheduler_svc.block_pool import BlockPool
from scheduler_svc.request import Request
from tests.scheduler_fakes import FakeWorker, make_request, make_scheduler, run_until_idle, step

PREFIX = list(range(200, 208))  # two blocks of 4


def prompt_request(request_id, prompt, **params):
    request = make_request(request_id, **params)
    request.prompt_token_ids = list(prompt)
    return request


def run_one(scheduler, worker, request):
    scheduler.add_request(request)
    run_until_idle(scheduler, worker)


# ---- the pool --------------------------------------------------------------------------

def test_freed_cached_blocks_are_evictable_and_reused_last_in_lru_order():
    pool = BlockPool(4)
    a, b, c = pool.allocate(3)
    pool.cache(a, b"A")
    pool.cache(b, b"B")
    pool.free([c, b, a])  # c has no hash: truly free; then b, a evictable, b the older
    assert pool.num_free == 4 and pool.num_cached == 2
    assert pool.allocate(2) == [3, c]  # truly free blocks first
    assert pool.cached_block(b"B") == b
    assert pool.allocate(1) == [b]  # then the least recently used cached block, forgotten
    assert pool.cached_block(b"B") is None and pool.cached_block(b"A") == a
    pool.check_integrity([3, c, b])


def test_sharing_an_evictable_block_takes_it_out_of_the_free_count():
    pool = BlockPool(2)
    [a] = pool.allocate(1)
    pool.cache(a, b"A")
    pool.free([a])
    assert pool.num_evictable_among([a]) == 1
    pool.share([a])
    pool.share([a])
    assert pool.ref_count(a) == 2 and pool.num_free == 1 and pool.num_evictable_among([a]) == 0
    pool.check_integrity([a, a])
    pool.free([a, a])
    pool.check_integrity([])


def test_a_second_block_with_the_same_contents_stays_private():
    pool = BlockPool(2)
    a, b = pool.allocate(2)
    pool.cache(a, b"A")
    pool.cache(b, b"A")  # computed twice (admitted in one step): the first stays cached
    assert pool.cached_block(b"A") == a and pool.hash_of(b) is None
    pool.free([a, b])
    assert pool.num_cached == 1
    pool.check_integrity([])


def test_dropping_the_cache_forgets_every_hash():
    pool = BlockPool(3)
    blocks = pool.allocate(3)
    for i, block_id in enumerate(blocks):
        pool.cache(block_id, bytes([i]))
    pool.free(blocks[:2])
    pool.drop_cache()
    assert pool.num_cached == 0 and pool.num_free == 2 and pool.cached_block(b"\x00") is None
    pool.check_integrity(blocks[2:])


# ---- the core --------------------------------------------------------------------------

def test_a_shared_prefix_is_computed_once_and_its_blocks_shared():
    scheduler, worker = make_scheduler(block_size=4), FakeWorker(4)
    scheduler.add_request(prompt_request("a", PREFIX + [1, 2], max_tokens=20))
    step(scheduler, worker)  # a computes its prompt; its two full blocks become cacheable
    scheduler.add_request(prompt_request("b", PREFIX + [3], max_tokens=2))
    plan, _ = step(scheduler, worker)
    [new] = plan.new_requests
    a = scheduler.get_request("a")
    assert new.num_computed_tokens == 8 and new.num_new_tokens == 1
    assert new.block_ids[:2] == a.block_ids[:2] and new.block_ids[2] != a.block_ids[2]
    assert [scheduler.block_manager.gpu.ref_count(b) for b in a.block_ids[:2]] == [2, 2]
    assert worker.num_cached_tokens_read == 8
    manager = scheduler.block_manager
    assert manager.num_prefix_cache_queries == 10 + 9 and manager.num_prefix_cache_hits == 8
    run_until_idle(scheduler, worker)
    assert scheduler.num_free_blocks == scheduler.num_total_blocks
    scheduler.check_integrity()


def test_a_prompt_whose_prefix_is_being_computed_waits_for_it_and_shares_it(monkeypatch):
    """Two plans in flight (async scheduling): b waits until the step computing a's prefix is
    applied, then enters sharing it, instead of computing it in the same step as a."""
    monkeypatch.setattr(block_manager_module, "MIN_SHARED_TOKENS", len(PREFIX))
    scheduler, worker = make_scheduler(block_size=4), FakeWorker(4)
    scheduler.add_request(prompt_request("a", PREFIX + [1], max_tokens=4))
    scheduler.add_request(prompt_request("b", PREFIX + [2], max_tokens=4))
    scheduler.add_request(prompt_request("c", [300, 301], max_tokens=4))  # behind b: waits too, in order
    first = scheduler.schedule()
    second = scheduler.schedule()
    assert [r.request_id for r in first.new_requests] == ["a"] and second.new_requests == []
    scheduler.update(first, worker.run(first))
    third = scheduler.schedule()
    assert [(r.request_id, r.num_computed_tokens) for r in third.new_requests] == [("b", 8), ("c", 0)]
    scheduler.update(second, worker.run(second))
    scheduler.update(third, worker.run(third))
    run_until_idle(scheduler, worker)
    assert worker.num_cached_tokens_read == 8
    assert scheduler.num_free_blocks == scheduler.num_total_blocks


def test_a_shared_run_shorter_than_the_minimum_is_computed_again(monkeypatch):
    monkeypatch.setattr(block_manager_module, "MIN_SHARED_TOKENS", len(PREFIX) + 4)
    scheduler, worker = make_scheduler(block_size=4), FakeWorker(4)
    scheduler.add_request(prompt_request("a", PREFIX + [1, 2, 3, 4, 5], max_tokens=2))
    scheduler.add_request(prompt_request("b", PREFIX + [6, 7, 8, 9, 10], max_tokens=2))
    plan, _ = step(scheduler, worker)
    assert [r.request_id for r in plan.new_requests] == ["a", "b"]
    run_until_idle(scheduler, worker)


def test_a_prompt_waiting_for_a_prefix_enters_when_its_computer_is_aborted(monkeypatch):
    monkeypatch.setattr(block_manager_module, "MIN_SHARED_TOKENS", len(PREFIX))
    scheduler, worker = make_scheduler(block_size=4), FakeWorker(4)
    scheduler.add_request(prompt_request("a", PREFIX + [1], max_tokens=4))
    first = scheduler.schedule()  # a computes the prefix, its step in flight
    scheduler.add_request(prompt_request("b", PREFIX + [2], max_tokens=4))
    second = scheduler.schedule()
    assert second.new_requests == []  # b waits for a's step
    scheduler.abort("a")
    for plan in (first, second):
        scheduler.update(plan, worker.run(plan))
    run_until_idle(scheduler, worker)  # b computes the prefix itself
    assert worker.num_cached_tokens_read == 0


def test_a_prompt_preempting_the_one_computing_its_prefix_computes_it_itself(monkeypatch):
    """Priority preemption: the urgent request does not wait for the prefix of the request it
    preempts, which computes nothing more."""
    monkeypatch.setattr(block_manager_module, "MIN_SHARED_TOKENS", len(PREFIX))
    scheduler, worker = make_scheduler(block_size=4, policy="priority", max_num_seqs=1), FakeWorker(4)
    scheduler.add_request(prompt_request("a", PREFIX + [1], max_tokens=4, priority=1))
    first = scheduler.schedule()
    scheduler.add_request(prompt_request("b", PREFIX + [2], max_tokens=4, priority=0))
    second = scheduler.schedule()
    assert second.preempted_ids == ["a"] and [r.request_id for r in second.new_requests] == ["b"]
    assert second.new_requests[0].num_computed_tokens == 0
    scheduler.update(first, worker.run(first))
    scheduler.update(second, worker.run(second))
    run_until_idle(scheduler, worker)
    scheduler.check_integrity()


def test_a_partly_shared_prefix_hits_up_to_the_first_different_block():
    scheduler, worker = make_scheduler(block_size=4), FakeWorker(4)
    run_one(scheduler, worker, prompt_request("a", PREFIX + [1, 2, 3, 4, 5], max_tokens=1))
    other = PREFIX[:4] + [9] + PREFIX[5:] + [1, 2, 3, 4, 5]  # differs in the second block
    scheduler.add_request(prompt_request("b", other, max_tokens=1))
    plan, _ = step(scheduler, worker)
    assert plan.new_requests[0].num_computed_tokens == 4  # the third block is equal but unreachable


def test_every_token_cached_recomputes_the_last_into_a_copy_of_the_shared_block():
    scheduler, worker = make_scheduler(block_size=4), FakeWorker(4)
    scheduler.add_request(prompt_request("a", PREFIX, max_tokens=20))
    step(scheduler, worker)
    a = scheduler.get_request("a")
    scheduler.add_request(prompt_request("b", PREFIX, max_tokens=3))
    plan, updates = step(scheduler, worker)
    [new] = plan.new_requests
    assert (new.num_computed_tokens, new.num_new_tokens) == (7, 1)  # the last token, for logits
    assert new.block_ids[0] == a.block_ids[0] and new.block_ids[1] != a.block_ids[1]
    assert plan.blocks_to_copy == [(a.block_ids[1], new.block_ids[1])]
    assert sorted(u.request.request_id for u in updates) == ["a", "b"]
    gpu = scheduler.block_manager.gpu
    assert gpu.ref_count(a.block_ids[1]) == 1  # the copy source is released after the step
    scheduler.check_integrity()
    scheduler.abort("a")
    run_until_idle(scheduler, worker)
    assert scheduler.num_free_blocks == scheduler.num_total_blocks


def test_freed_blocks_stay_cached_until_memory_is_needed_then_the_tail_goes_first():
    scheduler, worker = make_scheduler(num_gpu_blocks=4, block_size=4), FakeWorker(4)
    run_one(scheduler, worker, prompt_request("a", PREFIX, max_tokens=1))
    manager = scheduler.block_manager
    assert manager.num_cached_blocks == 2 and scheduler.num_free_blocks == 4  # evictable counts as free
    # 12 unrelated tokens need 3 blocks: the 2 truly free ones, then the LRU cached: a's tail.
    run_one(scheduler, worker, prompt_request("c", list(range(500, 512)), max_tokens=1))
    scheduler.add_request(prompt_request("d", PREFIX + [1], max_tokens=1))
    plan = scheduler.schedule()
    assert plan.new_requests[0].num_computed_tokens == 4  # the head block is still there
    scheduler.update(plan, worker.run(plan))
    run_until_idle(scheduler, worker)
    scheduler.check_integrity()


def test_recompute_preemption_finds_its_own_blocks_again():
    scheduler, worker = make_scheduler(num_gpu_blocks=4, block_size=2), FakeWorker(2)
    scheduler.add_request(prompt_request("a", [1, 2, 3, 4], ignore_eos=True, max_tokens=3))
    scheduler.add_request(prompt_request("b", [5, 6, 7, 8], ignore_eos=True, max_tokens=3))
    step(scheduler, worker)  # the pool is full
    plan, _ = step(scheduler, worker)  # a needs a third block: b goes, its tail block is evicted
    assert plan.preempted_ids == ["b"]
    b = scheduler.get_request("b")
    while b.status.name != "RUNNING":
        plan, _ = step(scheduler, worker)
    [new] = plan.new_requests
    assert new.request_id == "b" and new.num_computed_tokens == 2, "its head block was still cached"
    run_until_idle(scheduler, worker)
    assert scheduler.num_free_blocks == scheduler.num_total_blocks
    scheduler.check_integrity()


def test_swap_out_leaves_cached_copies_and_swap_in_offers_its_blocks_again():
    scheduler, worker = make_scheduler(num_gpu_blocks=4, block_size=2, num_cpu_blocks=8,
                                       preemption_mode="swap"), FakeWorker(2)
    scheduler.add_request(prompt_request("a", [1, 2], ignore_eos=True, max_tokens=4))
    scheduler.add_request(prompt_request("b", [5, 6], ignore_eos=True, max_tokens=8))
    plan, _ = step(scheduler, worker)
    while not plan.blocks_to_swap_out:
        plan, _ = step(scheduler, worker)
    b = scheduler.get_request("b")
    gpu = scheduler.block_manager.gpu
    [(head_copy, _), _] = plan.blocks_to_swap_out
    assert gpu.ref_count(head_copy) == 0 and gpu.cached_block(b.block_hashes[0]) == head_copy
    while not plan.blocks_to_swap_in:
        plan, _ = step(scheduler, worker)
    # Swapped back into fresh blocks, which the step's update() offered to the cache again.
    assert gpu.cached_block(b.block_hashes[0]) in (head_copy, b.block_ids[0])
    assert gpu.cached_block(b.block_hashes[1]) == b.block_ids[1]  # its tail copy was evicted
    scheduler.add_request(prompt_request("c", [5, 6, 9], max_tokens=1))
    run_until_idle(scheduler, worker)
    assert worker.num_cached_tokens_read == 2  # c found b's head block
    assert scheduler.block_manager.cpu.num_free == 8
    assert scheduler.num_free_blocks == scheduler.num_total_blocks
    scheduler.check_integrity()


def test_a_dead_worker_takes_the_cache_with_it():
    scheduler, worker = make_scheduler(block_size=4), FakeWorker(4)
    run_one(scheduler, worker, prompt_request("a", PREFIX + [1], max_tokens=1))
    scheduler.add_request(prompt_request("b", PREFIX + [2], max_tokens=4))
    step(scheduler, worker)
    assert scheduler.block_manager.num_cached_blocks >= 2
    requests = scheduler.take_unfinished()
    assert scheduler.block_manager.num_cached_blocks == 0
    assert all(r.block_hashes is None for r in requests)  # the next replica's block size may differ
    fresh = FakeWorker(4)  # holds no KV at all: a hit now would read garbage
    for request in requests:
        scheduler.add_request(request)
    plan = scheduler.schedule()
    assert plan.new_requests[0].num_computed_tokens == 0
    scheduler.update(plan, fresh.run(plan))
    run_until_idle(scheduler, fresh)


@pytest.mark.parametrize("make", [
    lambda: make_scheduler(block_size=4, enable_prefix_caching=False),
    lambda: make_scheduler(block_size=4, num_state_slots=4),  # a state model: always off
])
def test_no_caching_when_off_or_for_state_models(make):
    scheduler, worker = make(), FakeWorker(4)
    run_one(scheduler, worker, prompt_request("a", PREFIX + [1], max_tokens=2))
    scheduler.add_request(prompt_request("b", PREFIX + [1], max_tokens=2))
    plan = scheduler.schedule()
    assert plan.new_requests[0].num_computed_tokens == 0 and plan.blocks_to_copy == []
    assert scheduler.block_manager.num_cached_blocks == 0
    assert scheduler.block_manager.num_prefix_cache_queries == 0


def test_each_block_is_hashed_once_over_a_requests_life(monkeypatch):
    calls = []
    real = block_hash_module.hash_block
    monkeypatch.setattr(block_hash_module, "hash_block", lambda *a: calls.append(a) or real(*a))
    scheduler, worker = make_scheduler(num_gpu_blocks=5, block_size=2), FakeWorker(2)
    requests = [prompt_request(f"r{i}", [1, 2, 3, 4, 10 + i], ignore_eos=True, max_tokens=5) for i in range(3)]
    for request in requests:
        scheduler.add_request(request)
    run_until_idle(scheduler, worker)  # with preemptions and re-lookups
    assert scheduler.num_preemptions > 0
    assert len(calls) == sum(len(r.block_hashes) for r in requests)
    assert all(len(r.block_hashes) <= r.num_tokens // 2 for r in requests)


def test_lookup_stops_at_the_first_miss():
    manager = BlockManager(num_gpu_blocks=8, num_cpu_blocks=0, block_size=2, enable_prefix_caching=True)
    request = Request("r", list(range(16)), make_request().params)
    prefix = manager.find_cached_prefix(request)
    assert prefix.block_ids == [] and len(request.block_hashes) == 1  # one hash, one miss


def test_a_replica_of_a_state_model_says_why_caching_is_off(caplog):
    from protocol.worker_messages import WorkerHello
    from scheduler_svc.config import SchedulerConfig
    from scheduler_svc.replica import Replica

    hello = WorkerHello(worker_id="w", model="tiny-mamba", device="cpu", dtype="float32", vocab_size=100,
                        max_model_len=64, block_size=4, num_gpu_blocks=32, num_cpu_blocks=0,
                        num_state_slots=8, eos_token_ids=[2], tokenizer_json=None)
    with caplog.at_level("INFO", logger="stepserve.scheduler"):
        replica = Replica("w", hello, SchedulerConfig())
    assert not replica.core.enable_prefix_caching
    assert "prefix caching off" in caplog.text and "tiny-mamba" in caplog.text
