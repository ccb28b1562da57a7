"""The sans-IO scheduler core: queues, budgets, preemption, and the incremental step plan.

No sockets, no clocks, no torch. The service calls, in a loop:
    plan = scheduler.schedule()      # None: nothing to send
    ... send plan, receive result ... (add_request / abort may be called meanwhile)
    updates = scheduler.update(plan, result)

Cost contract: schedule() and update() cost O(running + newly finished); the waiting queue
is only ever touched at its front, and finished requests are found from the step's results.
Prefix caching adds O(blocks of the request) where a request is admitted (lookup) and where a
block of it fills up (registration), never a scan (scheduler_svc/block_manager.py).
Async scheduling: up to two plans may be in flight (a free-only one counts); schedule() plans
the next step as if every running request gets the token the step in flight is computing for it
(the worker appends sampled tokens itself, so a plan needs no token ids for running requests).
A request counts the tokens scheduled but not applied (num_inflight_tokens) and the tokens it
awaits (num_output_placeholders); num_computed_tokens only moves when a result is applied, so
the prefix cache only ever names computed KV. Plans run in order on the worker, which makes
freeing early exact: a block freed while a plan in flight still writes it is handed out only
in a later plan. A request that will finish by length when its awaited token arrives is not
scheduled again; one that stops on a token (EOS, a stop token) or is aborted meanwhile has the
token of the later plan discarded, and its id goes out in the next plan's finished_ids. A
request preempted while a step computes for it gets that step's token when it is applied, and
cannot be scheduled again before: preemption admits nothing in its plan (but requests more
urgent than every one it preempted, for whom priority preemption made room), and the plan after
is made once the step was applied. Hence two plans, never more.

Pooling requests (an embedder's, a classifier's) run their whole prompt in one step and end
when it is applied, with the worker's pooled values instead of a token; their model serves
nothing else, and its core neither caches prefixes nor swaps (validation.py keeps such a prompt
within one step's budget).

schedule(), update() and the ends of a request change one state (the queues, the block
manager, the steps in flight) whose invariants hold together (check_integrity), so they share
this class; the parts that stand alone have their own modules (step_batch, block_manager,
waiting_queue, stop_checks, validation).
"""
from collections import deque

from protocol.errors import ErrorCode
from protocol.worker_messages import NewRequestData, RunningRequestData, StepPlan, StepResult
from scheduler_svc.block_manager import BlockManager
from scheduler_svc.config import SchedulerConfig, WorkerCapacity
from scheduler_svc.errors import RequestRejected
from scheduler_svc.request import Request, RequestStatus, RequestUpdate
from scheduler_svc.step_batch import StepBatch, StepInFlight
from scheduler_svc.stop_checks import check_stop, reaches_length
from scheduler_svc.validation import check_request
from scheduler_svc.waiting_queue import make_waiting_queue

RUNNING = RequestStatus.RUNNING
SWAPPED = RequestStatus.SWAPPED
WAITING = RequestStatus.WAITING


class Scheduler:
    def __init__(self, config: SchedulerConfig, capacity: WorkerCapacity):
        self.config = config
        self.capacity = capacity
        # A state model's request cannot start mid-prompt without the Mamba state at that point.
        # A pooling model's requests (its only ones: validation.check_kind) run whole in one step
        # and keep nothing after it, so there is no prefix to share, nor KV worth swapping.
        self.enable_prefix_caching = (config.enable_prefix_caching and capacity.num_state_slots == 0
                                      and capacity.pooling is None)
        self.block_manager = BlockManager(capacity.num_gpu_blocks, capacity.num_cpu_blocks,
                                          capacity.block_size, self.enable_prefix_caching)
        # Longest a request may grow: the model's limit, what the whole pool holds (so one
        # request alone always fits and preemption cannot livelock), and without chunked
        # prefill one step's budget (a recomputed request must prefill in one step).
        max_len = min(capacity.max_model_len, capacity.num_gpu_blocks * capacity.block_size)
        if not config.enable_chunked_prefill:
            max_len = min(max_len, config.max_num_batched_tokens)
        self.max_len = max_len
        # Every running request (prefilling or decoding) holds a Mamba state slot.
        self.max_num_running = config.max_num_seqs
        if capacity.num_state_slots:
            self.max_num_running = min(self.max_num_running, capacity.num_state_slots)
        # Mamba state cannot be swapped (the worker has no CPU copy of it): always recompute.
        self.use_swap = (config.preemption_mode == "swap" and capacity.num_cpu_blocks > 0
                         and capacity.num_state_slots == 0 and capacity.pooling is None)
        self._eos_token_ids = frozenset(capacity.eos_token_ids)
        self._requests: dict[str, Request] = {}  # every live request, for O(1) abort
        self._waiting = make_waiting_queue(config.policy)
        self._running: dict[str, Request] = {}  # admission order; holds device blocks
        self._swapped: dict[str, Request] = {}  # swap-out order; holds CPU blocks
        self._pending_finished: list[str] = []  # for the next plan's finished_ids
        self._next_step_id = 0
        # Every plan returned and not yet update()d, oldest first: the one record of steps in flight.
        self._inflight: deque[StepInFlight] = deque()
        self.num_preemptions = 0  # for stats: how often memory pressure evicted a request

    # ---- requests in and out ---------------------------------------------------------

    def add_request(self, request: Request) -> None:
        if request.request_id in self._requests:
            raise RequestRejected(ErrorCode.DUPLICATE_ID, f"request id {request.request_id!r} is live")
        check_request(request, self.capacity, self.max_len, self.config.max_num_batched_tokens)
        assert request.status == WAITING and not request.block_ids, f"{request} is not new"
        self._requests[request.request_id] = request
        self._waiting.push(request)

    def abort(self, request_id: str, reason: str = "abort") -> Request | None:
        """Finish a live request now, from whichever queue; idempotent. O(1)."""
        assert reason in ("abort", "error"), reason
        request = self._requests.get(request_id)
        if request is None:
            return None
        self._finish(request, reason)
        return request

    def _finish(self, request: Request, reason: str, new_token_ids: list[int] | None = None,
                new_logprobs: list | None = None) -> RequestUpdate:
        """The one way a request ends in the core (stop, length, abort, error): out of its queue,
        its blocks freed, why recorded, its id queued for the worker; returns its last update."""
        old_status = request.status
        del self._requests[request.request_id]
        if old_status == RUNNING:
            del self._running[request.request_id]
            self.block_manager.free(request)
        elif old_status == SWAPPED:
            del self._swapped[request.request_id]
            self.block_manager.free(request, on_cpu=True)
        request.mark_finished(reason)
        if old_status == WAITING:
            self._waiting.mark_removed()  # lazy: skipped when it reaches the front
        # The worker may hold state for it (running, or preempted earlier): tell it, always.
        self._pending_finished.append(request.request_id)
        return RequestUpdate(request, new_token_ids or [], new_logprobs, reason)

    def take_unfinished(self) -> list[Request]:
        """For a dead worker: remove every live request, reset for recompute, in re-run order."""
        for request in self._running.values():
            self.block_manager.free(request)
        for request in self._swapped.values():
            self.block_manager.free(request, on_cpu=True)
        self.block_manager.drop_cache()  # the KV it named was the dead worker's
        requests = [*self._running.values(), *self._swapped.values(), *self._waiting.drain()]
        for request in requests:
            request.reset_for_recompute()
            request.num_inflight_tokens = request.num_output_placeholders = 0  # those steps are lost
            request.block_hashes = None  # hashes are per block size, and another replica's may differ
        self._running.clear()
        self._swapped.clear()
        self._requests.clear()
        self._pending_finished.clear()  # they were for the dead worker's state
        self._inflight.clear()
        return requests

    # ---- one step --------------------------------------------------------------------

    def schedule(self) -> StepPlan | None:
        """The next plan, or None when there is nothing to run and nothing to tell the worker."""
        assert len(self._inflight) < 2, "two plans in flight: update() the oldest first"
        batch = StepBatch(self.config.max_num_batched_tokens)
        urgent_below = None
        if self.config.policy == "priority":
            urgent_below = self._preempt_for_waiting(batch)
        num_preempted_for_waiting = len(batch.preempted_ids)
        self._schedule_running(batch)
        # Preemption for memory means memory is short: admit nothing more this step. It also
        # keeps CPU blocks freed by a swap-in from being reused by a swap-out of the same plan.
        if not batch.preempted_ids:
            self._schedule_swapped(batch)
            if not self._swapped:
                self._schedule_waiting(batch)
        elif urgent_below is not None and len(batch.preempted_ids) == num_preempted_for_waiting:
            # Seats were freed for the waiting head only: it enters in this same plan, not a
            # step later. Only requests more urgent than every one preempted are admitted, so a
            # request preempted here (a step may still compute for it) never re-enters before
            # that step is applied.
            self._schedule_waiting(batch, urgent_below)
        scheduled = batch.new_scheduled + batch.running_scheduled
        if not (scheduled or self._pending_finished or batch.preempted_ids):
            return None
        finished_ids, self._pending_finished = self._pending_finished, []
        plan = StepPlan(step_id=self._next_step_id, finished_ids=finished_ids,
                        preempted_ids=batch.preempted_ids, new_requests=batch.new_requests,
                        running_requests=batch.running_requests,
                        blocks_to_swap_out=batch.swap_out, blocks_to_swap_in=batch.swap_in,
                        blocks_to_copy=batch.copies)
        self._next_step_id += 1
        step = StepInFlight(plan, [])
        for request, data in zip(scheduled, (*batch.new_requests, *batch.running_requests)):
            num_new = data.num_new_tokens
            start = request.num_computed_tokens + request.num_inflight_tokens
            request.num_inflight_tokens += num_new
            # A step that reaches the last token (known or awaited) samples the next one.
            samples = start + num_new == request.num_tokens + request.num_output_placeholders
            request.num_output_placeholders += samples
            step.scheduled.append((request, num_new, samples))
        self._inflight.append(step)
        return plan

    def _schedule_running(self, batch: StepBatch) -> None:
        running = list(self._running.values())
        if self.config.policy == "priority":
            running.sort(key=_priority_key)  # victims are taken from the end: lowest first
        block_manager = self.block_manager
        block_size = self.capacity.block_size
        end = len(running)
        i = 0
        while i < end and batch.token_budget > 0:
            request = running[i]
            if request.num_output_placeholders and (request.pooling is not None or reaches_length(
                    request, len(request.output_token_ids) + request.num_output_placeholders, self.max_len)):
                i += 1  # its awaited token (or pooled result) is its last: nothing more to compute for it
                continue
            start = request.num_computed_tokens + request.num_inflight_tokens
            num_new = min(request.num_tokens + request.num_output_placeholders - start, batch.token_budget)
            assert num_new > 0, f"{request} is running with nothing to compute"
            num_tokens = start + num_new
            if num_tokens > len(request.block_ids) * block_size:
                while not block_manager.can_allocate(request, num_tokens):
                    end -= 1
                    self._preempt(running[end], batch)  # the newest (lowest priority) first
                    if end == i:
                        return  # preempted itself
                block_manager.append(request, num_tokens)
            batch.add_running(request, RunningRequestData(
                request.request_id, request.block_ids[request.num_blocks_sent:], num_new))
            request.num_blocks_sent = len(request.block_ids)
            i += 1

    def _preempt_for_waiting(self, batch: StepBatch) -> int | None:
        """vLLM's priority scheduling: a waiting request with a lower priority value than the
        least urgent running one, which finds no seat or no blocks beside it, takes its place;
        the running one is preempted. Returns the lowest priority value preempted (the waiting
        requests below it may enter in this plan), None when none was. O(running log running),
        and only when the head of the queue outranks someone running."""
        head = self._waiting.peek()
        if head is None or not self._running:
            return None
        lowest_preempted = None
        victims: list[Request] | None = None
        block_manager = self.block_manager
        while True:
            if len(self._running) < self.max_num_running:
                prefix = block_manager.find_cached_prefix(head)
                num_tokens = prefix.num_computed_tokens + min(head.num_tokens - prefix.num_computed_tokens,
                                                              self.config.max_num_batched_tokens)
                if block_manager.can_admit(head, prefix, num_tokens):
                    return lowest_preempted
            if victims is None:
                victims = sorted(self._running.values(), key=_priority_key)
            if not victims or victims[-1].priority <= head.priority:
                return lowest_preempted
            victim = victims.pop()
            lowest_preempted = victim.priority if lowest_preempted is None else min(lowest_preempted, victim.priority)
            self._preempt(victim, batch)

    def _preempt(self, request: Request, batch: StepBatch) -> None:
        del self._running[request.request_id]
        self.num_preemptions += 1
        if self.use_swap and self.block_manager.can_swap_out(request):
            batch.swap_out += self.block_manager.swap_out(request)
            request.status = SWAPPED
            self._swapped[request.request_id] = request
        else:
            self.block_manager.free(request)
            request.reset_for_recompute()
            self._waiting.push_front(request)  # outputs kept; recomputed before newer work
        # Either way the worker forgets the request; it comes back in new_requests.
        batch.preempted_ids.append(request.request_id)

    def _schedule_swapped(self, batch: StepBatch) -> None:
        swapped_in = []
        for request in self._swapped.values():
            num_new = self._num_new_tokens(request, request.num_computed_tokens, batch)
            if (num_new == 0 or len(self._running) + len(swapped_in) >= self.max_num_running
                    or not self.block_manager.can_swap_in(request, request.num_computed_tokens + num_new)):
                break
            batch.swap_in += self.block_manager.swap_in(request)
            self.block_manager.append(request, request.num_computed_tokens + num_new)
            swapped_in.append(request)
            self._start(request, num_new, batch)
        for request in swapped_in:
            del self._swapped[request.request_id]
            self._running[request.request_id] = request

    def _schedule_waiting(self, batch: StepBatch, priority_below: int | None = None) -> None:
        """Admits from the front of waiting while seats, budget and blocks allow; with
        priority_below, only requests of a lower priority value than it."""
        waiting, block_manager = self._waiting, self.block_manager
        while len(self._running) < self.max_num_running:
            request = waiting.peek()
            if request is None or (priority_below is not None and request.priority >= priority_below):
                break
            prefix = block_manager.find_cached_prefix(request)
            num_computed = prefix.num_computed_tokens
            num_new = self._num_new_tokens(request, num_computed, batch)
            if num_new == 0 or not block_manager.can_admit(request, prefix, num_computed + num_new):
                break  # strictly in order: a big head request is not overtaken
            if priority_below is None and block_manager.computes_shared_run(request, prefix):
                break  # its prefix is being computed: it enters a step or two later, sharing it
            waiting.pop()
            batch.copies += block_manager.admit(request, prefix, num_computed + num_new)
            request.num_computed_tokens = num_computed  # the KV of the prefix found is there
            self._running[request.request_id] = request
            self._start(request, num_new, batch)

    def _num_new_tokens(self, request: Request, num_computed: int, batch: StepBatch) -> int:
        """Tokens to compute for a request entering the batch with num_computed tokens' KV in
        place; 0 if it does not fit the budget."""
        num_new = request.num_tokens - num_computed
        if num_new <= batch.token_budget:
            return num_new
        # A pooling request is never chunked (validation.py keeps it within one step's budget).
        return batch.token_budget if self.config.enable_chunked_prefill and request.pooling is None else 0

    def _start(self, request: Request, num_new: int, batch: StepBatch) -> None:
        """Send a request the worker holds no state for: all its tokens and blocks, once."""
        assert not request.num_inflight_tokens, f"{request} starts with a step of it in flight"
        request.status = RUNNING
        batch.add_new(request, NewRequestData(
            request.request_id, request.all_token_ids, request.num_prompt_tokens,
            request.params, list(request.block_ids), request.num_computed_tokens, num_new, request.pooling))
        request.num_blocks_sent = len(request.block_ids)

    def update(self, plan: StepPlan, result: StepResult) -> list[RequestUpdate]:
        """Apply a step's result: advance, append tokens, stop checks, free what finished.
        Results are applied in the order their plans were made."""
        assert self._inflight and self._inflight[0].plan is plan, "not the oldest plan in flight"
        if result.step_id != plan.step_id:
            raise ValueError(f"result of step {result.step_id} for plan {plan.step_id}")
        scheduled = self._inflight.popleft().scheduled
        if not scheduled:
            return []  # a free-only plan
        self.block_manager.release_copy_sources()  # the worker copied them before its forward
        sampled = result.sampled_token_ids
        failed = result.error is not None or len(sampled) != len(scheduled)
        logprobs = result.logprobs
        eos_token_ids, max_len = self._eos_token_ids, self.max_len
        cache_computed_blocks = self.block_manager.cache_computed_blocks
        updates = []
        for i, (request, num_new, samples) in enumerate(scheduled):
            if request.is_finished:
                continue  # finished while the step ran (aborted, or a token of an earlier step)
            request.num_inflight_tokens -= num_new
            request.num_output_placeholders -= samples
            if failed:
                updates.append(self._finish(request, "error"))
                continue
            if i in result.prompt_logprobs and request.prompt_logprobs is not None:
                request.add_prompt_logprobs(*result.prompt_logprobs[i])
            status = request.status
            if status != WAITING:  # running, or swapped out since with this KV on board
                request.num_computed_tokens += num_new
            if status == RUNNING:
                # Its KV is computed now (this step was applied): full blocks become cacheable.
                cache_computed_blocks(request)
            if not samples:
                continue  # a prefill chunk short of the end: no token (the worker sent -1)
            if request.pooling is not None:
                updates.append(self._finish_pooling(request, result, i))
                continue
            token_id = sampled[i]
            if token_id < 0:
                updates.append(self._fail(request, result, i))
                continue
            request.output_token_ids.append(token_id)
            new_logprobs = None
            if request.output_logprobs is not None and logprobs is not None and logprobs[i] is not None:
                request.output_logprobs.append(logprobs[i])
                new_logprobs = [logprobs[i]]
            finish_reason = check_stop(request, token_id, eos_token_ids, max_len)
            if finish_reason is None:
                updates.append(RequestUpdate(request, [token_id], new_logprobs, None))
            else:
                updates.append(self._finish(request, finish_reason, [token_id], new_logprobs))
        return updates

    def _finish_pooling(self, request: Request, result: StepResult, index: int) -> RequestUpdate:
        """A pooling request's one step was applied: it ends with its pooled values (whether or
        not it was preempted meanwhile: the step computed its whole prompt)."""
        request.pooled = result.pooled.get(index)
        if request.pooled is None:
            return self._fail(request, result, index)
        return self._finish(request, "stop")

    def _fail(self, request: Request, result: StepResult, index: int) -> RequestUpdate:
        """The worker gave the request no result in a step that ran."""
        update = self._finish(request, "error")
        if index in result.request_errors:  # the worker refused this request alone: its parameters
            update.error = (ErrorCode.INVALID_PARAMS, result.request_errors[index])
        return update

    # ---- state -----------------------------------------------------------------------

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def waiting_head(self) -> Request | None:
        """The request the core admits next. O(1) (amortised over lazily removed entries)."""
        return self._waiting.peek()

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_swapped(self) -> int:
        return len(self._swapped)

    @property
    def num_free_blocks(self) -> int:
        return self.block_manager.num_free_blocks

    @property
    def num_total_blocks(self) -> int:
        return self.block_manager.num_total_blocks

    @property
    def num_free_state_slots(self) -> int:
        if not self.capacity.num_state_slots:
            return 0
        return self.capacity.num_state_slots - len(self._running)

    @property
    def num_plans_in_flight(self) -> int:
        """Plans returned by schedule() and not yet update()d (free-only ones too)."""
        return len(self._inflight)

    @property
    def oldest_plan_in_flight(self) -> StepPlan | None:
        return self._inflight[0].plan if self._inflight else None

    @property
    def has_plan_in_flight(self) -> bool:
        """A plan that computes for some request is in flight (not only a free-only one)."""
        return any(step.scheduled for step in self._inflight)

    def get_request(self, request_id: str) -> Request | None:
        return self._requests.get(request_id)

    def check_integrity(self) -> None:
        """Blocks and queues agree. O(all requests + all blocks): run it when idle, and in tests."""
        from scheduler_svc.integrity import check_integrity
        check_integrity(self, self._waiting.live_requests(), list(self._running.values()),
                        list(self._swapped.values()), self._requests)


def _priority_key(request: Request) -> tuple[int, int]:
    return (request.priority, request.arrival)
