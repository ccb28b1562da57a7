"""Unit tests of the scheduler core, one per behaviour and one per vLLM bug class."""
import pytest

from protocol.client_messages import TokenLogprobs
from protocol.errors import ErrorCode
from protocol.worker_messages import StepResult
from scheduler_svc.config import SchedulerConfig, WorkerCapacity
from scheduler_svc.errors import RequestRejected
from scheduler_svc.request import RequestStatus
from tests.scheduler_fakes import EOS, FakeWorker, make_request, make_scheduler, run_until_idle, step

def test_config_is_validated():
    with pytest.raises(ValueError):
        SchedulerConfig(preemption_mode="drop")
    with pytest.raises(ValueError):
        SchedulerConfig(max_num_seqs=0)
    with pytest.raises(ValueError):
        WorkerCapacity(num_gpu_blocks=0, block_size=16)


def test_plan_is_incremental_full_data_once_then_only_new_blocks():
    scheduler, worker = make_scheduler(block_size=4), FakeWorker(4)
    scheduler.add_request(make_request("a", prompt_len=3))
    plan, updates = step(scheduler, worker)
    [new] = plan.new_requests
    assert (new.request_id, new.token_ids, new.num_prompt_tokens, new.block_ids,
            new.num_computed_tokens, new.num_new_tokens) == ("a", [100, 101, 102], 3, [0], 0, 3)
    assert len(updates) == 1 and len(updates[0].new_token_ids) == 1
    plan, _ = step(scheduler, worker)  # token 4 still fits block 0
    assert plan.new_requests == [] and [(r.request_id, r.new_block_ids, r.num_new_tokens)
                                        for r in plan.running_requests] == [("a", [], 1)]
    plan, _ = step(scheduler, worker)  # token 5 needs a second block: only that id is sent
    assert plan.running_requests[0].new_block_ids == [1]
    scheduler.check_integrity()


def test_finish_by_max_tokens_frees_blocks_and_reports_in_next_plan():
    scheduler, worker = make_scheduler(), FakeWorker(4)
    request = make_request("a", max_tokens=3)
    scheduler.add_request(request)
    updates = run_until_idle(scheduler, worker)
    assert [u.finish_reason for u in updates] == [None, None, "length"]
    assert request.status == RequestStatus.FINISHED_LENGTH and len(request.output_token_ids) == 3
    assert scheduler.num_free_blocks == scheduler.num_total_blocks


def test_finished_ids_go_into_the_very_next_plan():
    scheduler, worker = make_scheduler(), FakeWorker(4)
    scheduler.add_request(make_request("a", max_tokens=1))
    scheduler.add_request(make_request("b", max_tokens=5))
    plan, updates = step(scheduler, worker)
    assert [u.finish_reason for u in updates] == ["length", None]
    plan, _ = step(scheduler, worker)
    assert plan.finished_ids == ["a"]
    plan, _ = step(scheduler, worker)
    assert plan.finished_ids == []


@pytest.mark.parametrize("params,tokens,reasons", [
    ({}, [7, EOS], [None, "stop"]),
    ({"ignore_eos": True, "max_tokens": 3}, [EOS, EOS, EOS], [None, None, "length"]),
    ({"stop_token_ids": [9]}, [7, 9], [None, "stop"]),
    ({"min_tokens": 2}, [EOS, 9, EOS], [None, None, "stop"]),
    ({"min_tokens": 2, "stop_token_ids": [9]}, [9, 9], [None, "stop"]),  # the 2nd output may stop
])
def test_stop_checks(params, tokens, reasons):
    scheduler, worker = make_scheduler(), FakeWorker(4)
    scheduler.add_request(make_request("a", **params))
    got = []
    for token in tokens:
        worker.next_tokens["a"] = token
        _, updates = step(scheduler, worker)
        got.append(updates[0].finish_reason)
    assert got == reasons


def test_stops_at_max_model_len():
    scheduler, worker = make_scheduler(max_model_len=6), FakeWorker(4)
    request = make_request("a", prompt_len=4, max_tokens=100, ignore_eos=True)
    scheduler.add_request(request)
    updates = run_until_idle(scheduler, worker)
    assert updates[-1].finish_reason == "length" and request.num_tokens == 6


def test_duplicate_live_id_is_rejected_but_finished_id_may_return():
    scheduler = make_scheduler()
    scheduler.add_request(make_request("a"))
    with pytest.raises(RequestRejected) as e:
        scheduler.add_request(make_request("a"))
    assert e.value.code == ErrorCode.DUPLICATE_ID
    scheduler.abort("a")
    scheduler.add_request(make_request("a"))
    assert scheduler.num_waiting == 1


@pytest.mark.parametrize("prompt_len,num_gpu_blocks,max_model_len", [(16, 64, 16), (16, 4, 256)])
def test_prompt_that_can_never_run_is_rejected(prompt_len, num_gpu_blocks, max_model_len):
    scheduler = make_scheduler(num_gpu_blocks=num_gpu_blocks, max_model_len=max_model_len)
    with pytest.raises(RequestRejected) as e:
        scheduler.add_request(make_request("a", prompt_len=prompt_len))
    assert e.value.code == ErrorCode.PROMPT_TOO_LONG
    scheduler.add_request(make_request("b", prompt_len=prompt_len - 1))  # one shorter fits


def test_abort_is_idempotent_and_lazy_in_waiting():
    scheduler = make_scheduler()
    for i in range(5):
        scheduler.add_request(make_request(f"r{i}"))
    request = scheduler.abort("r2")
    assert request.finish_reason == "abort" and request.is_finished
    assert scheduler.abort("r2") is None and scheduler.abort("nope") is None
    assert scheduler.num_waiting == 4
    plan = scheduler.schedule()
    assert plan.finished_ids == ["r2"]
    assert [r.request_id for r in plan.new_requests] == ["r0", "r1", "r3", "r4"]


def test_free_only_plan_when_nothing_is_scheduled_but_ids_are_pending():
    # vLLM #13129 / #15296: finished ids must reach the worker even when no request runs.
    scheduler, worker = make_scheduler(), FakeWorker(4)
    scheduler.add_request(make_request("a", max_tokens=2))
    run_until_idle(scheduler, worker)  # its last plan was free-only
    assert "a" not in worker.requests
    scheduler.add_request(make_request("b"))
    step(scheduler, worker)
    scheduler.abort("b")
    plan = scheduler.schedule()
    assert plan.finished_ids == ["b"] and plan.num_scheduled == 0
    assert scheduler.update(plan, worker.run(plan)) == []
    assert scheduler.schedule() is None


def test_ids_are_handed_over_only_in_a_returned_plan():
    # vLLM #13129: ids were taken from the pending list by a step that sent no plan, and lost.
    scheduler = make_scheduler()
    assert scheduler.schedule() is None
    scheduler.add_request(make_request("a"))
    scheduler.abort("a")
    plan = scheduler.schedule()
    assert plan.finished_ids == ["a"]
    assert scheduler.schedule() is None


def test_abort_during_step_is_applied_before_its_results():
    # vLLM #26400: an abort between schedule() and update() must win over the step's token.
    scheduler, worker = make_scheduler(), FakeWorker(4)
    scheduler.add_request(make_request("a"))
    scheduler.add_request(make_request("b"))
    step(scheduler, worker)
    plan = scheduler.schedule()
    request = scheduler.abort("a")
    assert scheduler.num_free_blocks == scheduler.num_total_blocks - 2  # a's blocks freed now
    updates = scheduler.update(plan, worker.run(plan))
    assert [u.request.request_id for u in updates] == ["b"]
    assert request.finish_reason == "abort" and len(request.output_token_ids) == 1
    scheduler.check_integrity()  # no double free
    assert scheduler.schedule().finished_ids == ["a"]


def test_abort_and_resubmit_same_id_during_a_step():
    scheduler, worker = make_scheduler(), FakeWorker(4)
    scheduler.add_request(make_request("a"))
    plan = scheduler.schedule()
    old = scheduler.abort("a")
    new = make_request("a", prompt_len=6)
    scheduler.add_request(new)
    assert scheduler.update(plan, worker.run(plan)) == []  # the old one's token is dropped
    assert old.output_token_ids == [] and new.status == RequestStatus.WAITING
    plan = scheduler.schedule()
    assert plan.finished_ids == ["a"] and [r.num_prompt_tokens for r in plan.new_requests] == [6]
    scheduler.update(plan, worker.run(plan))  # the worker freed the old state before adding
    assert new.output_token_ids and scheduler.get_request("a") is new
    scheduler.check_integrity()


def test_abort_in_swapped_queue_reaches_finished_ids():
    # vLLM #6865 discussion: ids aborted in the swapped queue never reached the Mamba cache.
    scheduler, worker = make_scheduler(num_gpu_blocks=3, block_size=2, num_cpu_blocks=8,
                                       preemption_mode="swap"), FakeWorker(2)
    scheduler.add_request(make_request("a", prompt_len=2, ignore_eos=True))
    scheduler.add_request(make_request("b", prompt_len=2, ignore_eos=True))
    step(scheduler, worker)
    plan, _ = step(scheduler, worker)  # a takes the last block; b, short of one, swaps out
    assert plan.preempted_ids == ["b"] and len(plan.blocks_to_swap_out) == 1
    assert scheduler.num_swapped == 1
    scheduler.abort("b")
    assert scheduler.num_swapped == 0 and scheduler.block_manager.cpu.num_free == 8
    assert scheduler.schedule().finished_ids == ["b"]


def test_chunked_prefill_splits_a_long_prompt_within_the_token_budget():
    scheduler, worker = make_scheduler(max_num_batched_tokens=8), FakeWorker(4)
    scheduler.add_request(make_request("a", prompt_len=20))
    chunks = []
    for _ in range(3):
        plan, updates = step(scheduler, worker)
        data = plan.new_requests or plan.running_requests
        chunks.append(data[0].num_new_tokens)
        assert sum(d.num_new_tokens for d in plan.new_requests + plan.running_requests) <= 8
    assert chunks == [8, 8, 4] and len(updates) == 1  # a token only after the last chunk
    assert scheduler.get_request("a").num_computed_tokens == 20


def test_without_chunked_prefill_a_prompt_over_the_budget_is_rejected():
    scheduler = make_scheduler(max_num_batched_tokens=8, enable_chunked_prefill=False)
    with pytest.raises(RequestRejected):
        scheduler.add_request(make_request("a", prompt_len=8))
    scheduler.add_request(make_request("b", prompt_len=6))
    scheduler.add_request(make_request("c", prompt_len=6))
    assert [r.request_id for r in scheduler.schedule().new_requests] == ["b"]  # c waits whole


def test_max_num_seqs_bounds_the_batch():
    scheduler, worker = make_scheduler(max_num_seqs=3), FakeWorker(4)
    for i in range(5):
        scheduler.add_request(make_request(f"r{i}"))
    plan, _ = step(scheduler, worker)
    assert plan.num_scheduled == 3 and scheduler.num_waiting == 2


def test_recompute_preemption_puts_the_newest_back_at_the_front():
    scheduler, worker = make_scheduler(num_gpu_blocks=3, block_size=2), FakeWorker(2)
    for name in "abc":
        scheduler.add_request(make_request(name, prompt_len=2, ignore_eos=True, max_tokens=3))
    plan, _ = step(scheduler, worker)
    assert [r.request_id for r in plan.new_requests] == ["a", "b", "c"]
    plan, _ = step(scheduler, worker)  # a takes c's block (newest first); b then preempts itself
    assert plan.preempted_ids == ["c", "b"] and [r.request_id for r in plan.running_requests] == ["a"]
    c = scheduler.get_request("c")
    assert c.status == RequestStatus.WAITING and c.block_ids == [] and len(c.output_token_ids) == 1
    scheduler.add_request(make_request("d", prompt_len=2))
    order = []
    for _ in range(50):
        plan = scheduler.schedule()
        if plan is None:
            break
        order += [r.request_id for r in plan.new_requests]
        scheduler.update(plan, worker.run(plan))
    assert list(dict.fromkeys(order)) == ["b", "c", "d"]  # preempted ones back at the front, in admission order
    assert len(c.output_token_ids) == 3 and scheduler.num_free_blocks == 3


def test_recomputed_request_is_resent_with_its_outputs():
    scheduler, worker = make_scheduler(num_gpu_blocks=2, block_size=2, enable_prefix_caching=False), FakeWorker(2)
    scheduler.add_request(make_request("a", prompt_len=2, ignore_eos=True))
    scheduler.add_request(make_request("b", prompt_len=2, ignore_eos=True))
    step(scheduler, worker)
    step(scheduler, worker)  # b preempted
    b = scheduler.get_request("b")
    scheduler.abort("a")
    plan = scheduler.schedule()
    [new] = plan.new_requests
    assert new.request_id == "b" and new.token_ids == b.all_token_ids and new.num_computed_tokens == 0
    assert new.num_new_tokens == 3


def test_swap_in_resends_blocks_and_computed_count():
    scheduler, worker = make_scheduler(num_gpu_blocks=2, block_size=2, num_cpu_blocks=4,
                                       preemption_mode="swap"), FakeWorker(2)
    scheduler.add_request(make_request("a", prompt_len=2, ignore_eos=True, max_tokens=2))
    scheduler.add_request(make_request("b", prompt_len=2, ignore_eos=True, max_tokens=2))
    step(scheduler, worker)
    plan, _ = step(scheduler, worker)  # b swapped out, a finishes
    assert plan.blocks_to_swap_out and scheduler.num_swapped == 1
    plan, _ = step(scheduler, worker)
    [new] = plan.new_requests
    assert new.request_id == "b" and new.num_computed_tokens == 2 and new.num_new_tokens == 1
    assert [dst for _, dst in plan.blocks_to_swap_in] == new.block_ids[:1] and len(new.block_ids) == 2
    run_until_idle(scheduler, worker)
    assert scheduler.block_manager.cpu.num_free == 4 and scheduler.num_free_blocks == 2


def test_state_slots_bound_running_and_force_recompute():
    scheduler, worker = make_scheduler(num_gpu_blocks=3, block_size=2, num_cpu_blocks=8,
                                       num_state_slots=2, preemption_mode="swap"), FakeWorker(2)
    for name in "abc":
        scheduler.add_request(make_request(name, prompt_len=2, ignore_eos=True))
    plan, _ = step(scheduler, worker)
    assert plan.num_scheduled == 2 and scheduler.num_free_state_slots == 0
    plan, _ = step(scheduler, worker)  # a needs a block, b is preempted: by recompute, not swap
    assert plan.preempted_ids == ["b"] and plan.blocks_to_swap_out == [] and scheduler.num_swapped == 0
    assert scheduler.num_free_state_slots == 1


def test_priority_policy_admits_lower_values_first_ties_by_arrival():
    # vLLM's convention: a lower value is served first.
    scheduler = make_scheduler(policy="priority", max_num_seqs=3)
    for name, priority in [("low", 5), ("high1", 0), ("mid", 1), ("high2", 0)]:
        scheduler.add_request(make_request(name, priority=priority))
    assert [r.request_id for r in scheduler.schedule().new_requests] == ["high1", "high2", "mid"]


def test_priority_policy_preempts_a_running_batch_request_for_a_more_urgent_one():
    scheduler, worker = make_scheduler(policy="priority", max_num_seqs=2), FakeWorker(4)
    for name in ("batch1", "batch2"):
        scheduler.add_request(make_request(name, priority=1, max_tokens=50, ignore_eos=True))
    step(scheduler, worker)
    scheduler.add_request(make_request("interactive", priority=0, max_tokens=3, ignore_eos=True))
    plan, _ = step(scheduler, worker)  # no seat: the newest batch request makes room, at once
    assert plan.preempted_ids == ["batch2"] and [r.request_id for r in plan.new_requests] == ["interactive"]
    scheduler.add_request(make_request("same", priority=1, max_tokens=3))
    plan, _ = step(scheduler, worker)  # an equal priority never preempts
    assert not plan.preempted_ids and not plan.new_requests
    run_until_idle(scheduler, worker)


def test_priority_preemption_admits_only_requests_more_urgent_than_those_it_preempted():
    # Three seats of batch work (priority 2, 2, 1); waiting: two interactive requests (0) and a
    # batch one of priority 1. The two least urgent are preempted for the interactive ones, which
    # enter in the same plan; neither the preempted ones nor the waiting priority-1 request do,
    # though the plan has budget left (a step in flight may still compute for a preempted one).
    scheduler, worker = make_scheduler(policy="priority", max_num_seqs=3), FakeWorker(4)
    for name, priority in (("batch-a", 2), ("batch-b", 2), ("batch-c", 1)):
        scheduler.add_request(make_request(name, priority=priority, max_tokens=50, ignore_eos=True))
    step(scheduler, worker)
    scheduler.add_request(make_request("waiting-1", priority=1, max_tokens=3))
    scheduler.add_request(make_request("chat-1", priority=0, max_tokens=3, ignore_eos=True))
    scheduler.add_request(make_request("chat-2", priority=0, max_tokens=3, ignore_eos=True))
    plan = scheduler.schedule()
    assert plan.preempted_ids == ["batch-b"]  # room for the head only; the next plan makes more
    assert [r.request_id for r in plan.new_requests] == ["chat-1"]
    scheduler.update(plan, worker.run(plan))
    plan, _ = step(scheduler, worker)
    assert plan.preempted_ids == ["batch-a"] and [r.request_id for r in plan.new_requests] == ["chat-2"]
    run_until_idle(scheduler, worker)


def test_priority_preemption_under_async_scheduling_re_admits_no_request_with_a_step_in_flight():
    # Two plans in flight: the preempting plan is made while a step still computes for its
    # victim; the victim comes back only once that step was applied, with its token.
    scheduler, worker = make_scheduler(policy="priority", max_num_seqs=1), FakeWorker(4)
    scheduler.add_request(make_request("batch", priority=1, max_tokens=6, ignore_eos=True))
    first = scheduler.schedule()
    first_result = worker.run(first)
    scheduler.add_request(make_request("chat", priority=0, max_tokens=2, ignore_eos=True))
    second = scheduler.schedule()  # made while the first is in flight
    assert second.preempted_ids == ["batch"] and [r.request_id for r in second.new_requests] == ["chat"]
    second_result = worker.run(second)
    scheduler.update(first, first_result)
    batch = scheduler.get_request("batch")
    assert len(batch.output_token_ids) == 1  # the token of the step in flight when it was preempted
    scheduler.update(second, second_result)
    run_until_idle(scheduler, worker)
    assert batch.finish_reason == "length" and len(batch.output_token_ids) == 6


def test_take_unfinished_returns_all_live_requests_reset_in_rerun_order():
    scheduler, worker = make_scheduler(num_gpu_blocks=3, block_size=2, num_cpu_blocks=8,
                                       preemption_mode="swap", max_num_seqs=3), FakeWorker(2)
    for name in "abcd":
        scheduler.add_request(make_request(name, prompt_len=2, ignore_eos=True))
    step(scheduler, worker)
    step(scheduler, worker)  # c swapped out; d still waiting
    scheduler.abort("b")
    plan = scheduler.schedule()  # in flight when the worker dies
    requests = scheduler.take_unfinished()
    assert [r.request_id for r in requests] == ["a", "c", "d"]  # running, swapped, waiting
    assert all(r.status == RequestStatus.WAITING and r.num_computed_tokens == 0 and not r.block_ids
               for r in requests)
    assert requests[0].output_token_ids  # outputs kept for recompute
    assert scheduler.num_waiting == scheduler.num_running == scheduler.num_swapped == 0
    assert scheduler.num_free_blocks == 3 and scheduler.block_manager.cpu.num_free == 8
    scheduler.check_integrity()
    assert plan is not None and scheduler.schedule() is None
    for request in requests:  # a new worker: the same requests run to the end
        scheduler.add_request(request)
    run_until_idle(scheduler, FakeWorker(2))
    assert all(r.finish_reason == "length" for r in requests)


def test_failed_step_finishes_its_requests_with_error():
    scheduler = make_scheduler()
    scheduler.add_request(make_request("a"))
    scheduler.add_request(make_request("b"))
    plan = scheduler.schedule()
    updates = scheduler.update(plan, StepResult(step_id=plan.step_id, sampled_token_ids=[], error="oom"))
    assert [(u.request.request_id, u.finish_reason) for u in updates] == [("a", "error"), ("b", "error")]
    assert scheduler.schedule().finished_ids == ["a", "b"]
    assert scheduler.num_free_blocks == scheduler.num_total_blocks


def test_logprobs_are_kept_when_asked():
    scheduler = make_scheduler()
    scheduler.add_request(make_request("a", logprobs=1))
    plan = scheduler.schedule()
    lp = TokenLogprobs(token_id=7, logprob=-0.5)
    [update] = scheduler.update(plan, StepResult(step_id=plan.step_id, sampled_token_ids=[7], logprobs=[lp]))
    assert update.new_logprobs == [lp] and scheduler.get_request("a").output_logprobs == [lp]


def test_integrity_check_catches_a_request_in_two_queues():
    scheduler, worker = make_scheduler(), FakeWorker(4)
    scheduler.add_request(make_request("a"))
    step(scheduler, worker)
    scheduler.check_integrity()
    scheduler._swapped["a"] = scheduler.get_request("a")  # corrupt on purpose
    with pytest.raises(AssertionError):
        scheduler.check_integrity()


def test_mass_abort_in_waiting_is_lazy_and_compacted():
    scheduler = make_scheduler()
    for i in range(20_000):
        scheduler.add_request(make_request(f"r{i}"))
    for i in range(19_990):
        scheduler.abort(f"r{i}")
    assert scheduler.num_waiting == 10
    assert len(scheduler._waiting._queue) < 10_000  # compacted, dead ones released
    plan = scheduler.schedule()
    assert len(plan.finished_ids) == 19_990 and len(plan.new_requests) == 10
