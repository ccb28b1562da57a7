"""The scheduler core with pooling requests: one whole step each, ended by their pooled values."""
import re

import pytest

from protocol.errors import ErrorCode
from protocol.pooling import PoolingInfo, PoolingParams
from protocol.sampling import SamplingParams
from protocol.worker_messages import StepResult
from scheduler_svc.errors import RequestRejected
from scheduler_svc.request import Request
from tests.scheduler_fakes import (EMBED_MODEL, FakeWorker, make_request, make_scheduler, pooled_values,
                                   run_until_idle, step)

EMBED = PoolingParams()


def embed_request(request_id, prompt_len=4, **kwargs):
    return make_request(request_id, prompt_len, pooling=EMBED, max_tokens=1, **kwargs)


def test_pooling_requests_end_after_their_one_step_with_their_values_and_free_their_blocks():
    scheduler, worker = make_scheduler(pooling=EMBED_MODEL, block_size=4), FakeWorker(4)
    requests = [embed_request(f"e{n}", prompt_len=n) for n in (1, 4, 9)]
    for request in requests:
        scheduler.add_request(request)
    plan, updates = step(scheduler, worker)
    assert [(d.request_id, d.num_computed_tokens, d.num_new_tokens, d.pooling) for d in plan.new_requests] == [
        ("e1", 0, 1, EMBED), ("e4", 0, 4, EMBED), ("e9", 0, 9, EMBED)]
    assert [(u.request.request_id, u.new_token_ids, u.finish_reason) for u in updates] == [
        ("e1", [], "stop"), ("e4", [], "stop"), ("e9", [], "stop")]
    assert [r.pooled for r in requests] == [pooled_values(r.prompt_token_ids) for r in requests]
    assert all(not r.output_token_ids for r in requests)
    assert scheduler.num_running == 0 and scheduler.num_free_blocks == scheduler.num_total_blocks
    plan, _ = step(scheduler, worker)  # only the frees are left for the worker
    assert plan.finished_ids == ["e1", "e4", "e9"] and plan.num_scheduled == 0
    scheduler.check_integrity()


def test_a_pooling_request_is_never_chunked_it_waits_for_a_step_with_room():
    scheduler, worker = make_scheduler(pooling=EMBED_MODEL, max_num_batched_tokens=16), FakeWorker(4)
    for name in ("a", "b", "c"):
        scheduler.add_request(embed_request(name, prompt_len=10))
    planned = []
    for _ in range(3):
        plan, _ = step(scheduler, worker)
        planned.append([(d.request_id, d.num_new_tokens) for d in plan.new_requests])
    assert planned == [[("a", 10)], [("b", 10)], [("c", 10)]]


@pytest.mark.parametrize("prompt_len,budget,max_model_len,num_gpu_blocks,limit", [
    (17, 16, 256, 64, "max_num_batched_tokens 16"),
    (33, 64, 32, 64, "max_model_len 32"),
    (21, 64, 256, 5, "5 blocks of 4 tokens"),
])
def test_a_pooling_prompt_longer_than_one_step_can_hold_is_refused_with_the_reason(
        prompt_len, budget, max_model_len, num_gpu_blocks, limit):
    scheduler = make_scheduler(pooling=EMBED_MODEL, max_num_batched_tokens=budget, max_model_len=max_model_len,
                               num_gpu_blocks=num_gpu_blocks)
    with pytest.raises(RequestRejected) as refused:
        scheduler.add_request(embed_request("long", prompt_len=prompt_len))
    assert refused.value.code == ErrorCode.PROMPT_TOO_LONG
    assert limit in refused.value.message and f"limit is {prompt_len - 1}" in refused.value.message
    scheduler.add_request(embed_request("fits", prompt_len=prompt_len - 1))  # exactly the limit: one step
    updates = run_until_idle(scheduler, FakeWorker(4))
    assert [u.finish_reason for u in updates] == ["stop"]


def test_the_kind_of_request_must_be_the_model_kind():
    generative, embedder = make_scheduler(), make_scheduler(pooling=EMBED_MODEL)
    classifier = make_scheduler(pooling=PoolingInfo(task="classify", size=1, normalize=False))
    for scheduler, request, says in [
            (generative, embed_request("e"), "this model generates text"),
            (embedder, make_request("g"), "pooling model (task 'embed')"),
            (classifier, embed_request("e"), "pooling task is 'classify'"),
            (embedder, make_request("c", pooling=PoolingParams(task="classify")), "pooling task is 'embed'")]:
        with pytest.raises(RequestRejected, match=re.escape(says)) as refused:
            scheduler.add_request(request)
        assert refused.value.code == ErrorCode.INVALID_PARAMS
    classifier.add_request(make_request("c", pooling=PoolingParams(task="classify")))
    assert [u.finish_reason for u in run_until_idle(classifier, FakeWorker(4))] == ["stop"]


def test_under_async_scheduling_a_pooling_request_in_flight_is_not_scheduled_again():
    # Its sampling params ask for many tokens: ignored, the pooled result is its end.
    scheduler, worker = make_scheduler(pooling=EMBED_MODEL), FakeWorker(4)
    scheduler.add_request(make_request("a", pooling=EMBED, max_tokens=16))
    first = scheduler.schedule()
    scheduler.add_request(embed_request("b"))
    second = scheduler.schedule()  # made while the first is in flight
    assert [d.request_id for d in second.new_requests] == ["b"] and second.running_requests == []
    [a] = scheduler.update(first, worker.run(first))
    [b] = scheduler.update(second, worker.run(second))
    assert (a.finish_reason, b.finish_reason) == ("stop", "stop")
    assert scheduler.schedule().finished_ids == ["a", "b"]


def test_a_pooling_request_preempted_while_its_step_runs_ends_with_that_steps_values():
    scheduler, worker = make_scheduler(pooling=EMBED_MODEL, policy="priority", max_num_seqs=1), FakeWorker(4)
    batch = embed_request("batch", priority=1)
    scheduler.add_request(batch)
    first = scheduler.schedule()
    scheduler.add_request(embed_request("chat", priority=0))
    second = scheduler.schedule()  # its seat goes to the more urgent request
    assert second.preempted_ids == ["batch"] and [d.request_id for d in second.new_requests] == ["chat"]
    [update] = scheduler.update(first, worker.run(first))
    assert update.finish_reason == "stop" and batch.pooled == pooled_values(batch.prompt_token_ids)
    scheduler.update(second, worker.run(second))
    run_until_idle(scheduler, worker)
    assert scheduler.num_free_blocks == scheduler.num_total_blocks


def test_a_pooling_request_without_values_fails_alone_with_the_workers_reason():
    scheduler = make_scheduler(pooling=EMBED_MODEL)
    for name in ("bad", "lost", "good"):
        scheduler.add_request(embed_request(name))
    plan = scheduler.schedule()
    result = StepResult(step_id=plan.step_id, sampled_token_ids=[-1, -1, -1], pooled={2: pooled_values([1])},
                        request_errors={0: "token_type_ids past the model's 2 types"})
    updates = scheduler.update(plan, result)
    assert [(u.finish_reason, u.error) for u in updates] == [
        ("error", (ErrorCode.INVALID_PARAMS, "token_type_ids past the model's 2 types")), ("error", None),
        ("stop", None)]
    assert scheduler.num_free_blocks == scheduler.num_total_blocks


def test_a_pooling_model_neither_caches_prefixes_nor_swaps():
    scheduler = make_scheduler(pooling=EMBED_MODEL, num_cpu_blocks=8, preemption_mode="swap")
    assert not scheduler.enable_prefix_caching and not scheduler.use_swap
    worker = FakeWorker(4)
    for name in ("a", "b"):  # the same prompt twice: nothing found, nothing cached
        scheduler.add_request(embed_request(name, prompt_len=8))
        run_until_idle(scheduler, worker)
    assert scheduler.block_manager.num_cached_blocks == 0 and worker.num_cached_tokens_read == 0


class CountingRequest(Request):
    """A request that counts every read of its attributes: the core's work on it."""

    __slots__ = ()
    reads = 0

    def __getattribute__(self, name):
        CountingRequest.reads += 1
        return super().__getattribute__(name)


def reads_of_two_steps(num_waiting: int) -> int:
    scheduler, worker = make_scheduler(pooling=EMBED_MODEL, max_num_batched_tokens=64), FakeWorker(4)
    for i in range(num_waiting):
        scheduler.add_request(CountingRequest(f"r{i}", list(range(100, 108)), SamplingParams(max_tokens=1),
                                              pooling=EMBED))
    CountingRequest.reads = 0
    for _ in range(2):
        plan, updates = step(scheduler, worker)
        assert len(plan.new_requests) == len(updates) == 8
    return CountingRequest.reads


def test_a_pooling_step_costs_the_same_whatever_waits():
    # DESIGN.md's contract: a step is O(batch), never O(waiting). Two steps of 8 requests each
    # read the same attributes whether 24 or 20,000 requests wait behind them.
    assert reads_of_two_steps(24) == reads_of_two_steps(20_000) > 0
