"""A stand-in for the worker that mirrors its per-request state and checks every plan.

It keeps what a real worker keeps between steps (token ids, computed count, block table) and
asserts the plan is consistent with that: new requests are unknown to it, running ones known,
block tables only grow, nothing computes past its tokens or its blocks.
"""
import random

from protocol.worker_messages import StepPlan, StepResult


class WorkerRequest:
    __slots__ = ("token_ids", "num_computed_tokens", "block_ids")

    def __init__(self, token_ids, num_computed_tokens, block_ids):
        self.token_ids = list(token_ids)
        self.num_computed_tokens = num_computed_tokens
        self.block_ids = list(block_ids)


class FakeWorker:
    def __init__(self, block_size: int, vocab: list[int] | None = None, seed: int = 0):
        self.block_size = block_size
        self.vocab = vocab or list(range(10, 100))
        self.rng = random.Random(seed)
        self.requests: dict[str, WorkerRequest] = {}
        self.next_tokens: dict[str, int] = {}  # forced tokens for the next step, by id

    def run(self, plan: StepPlan) -> StepResult:
        for request_id in plan.finished_ids:
            self.requests.pop(request_id, None)  # unknown ids are ignored
        for request_id in plan.preempted_ids:
            assert request_id in self.requests, f"preempted {request_id} is unknown to the worker"
            del self.requests[request_id]
        for pairs in (plan.blocks_to_swap_out, plan.blocks_to_swap_in):
            assert len({src for src, _ in pairs}) == len(pairs) and len({dst for _, dst in pairs}) == len(pairs)
        sampled = []
        for data in plan.new_requests:
            assert data.request_id not in self.requests, f"{data.request_id} sent as new twice"
            request = WorkerRequest(data.token_ids, data.num_computed_tokens, data.block_ids)
            self.requests[data.request_id] = request
            sampled.append(self._compute(data.request_id, request, data.num_new_tokens))
        for data in plan.running_requests:
            request = self.requests[data.request_id]
            request.block_ids += data.new_block_ids
            sampled.append(self._compute(data.request_id, request, data.num_new_tokens))
        return StepResult(step_id=plan.step_id, sampled_token_ids=sampled)

    def _compute(self, request_id: str, request: WorkerRequest, num_new: int) -> int:
        assert num_new > 0
        end = request.num_computed_tokens + num_new
        assert end <= len(request.token_ids), "computes past its tokens"
        assert end <= len(request.block_ids) * self.block_size, "computes past its blocks"
        request.num_computed_tokens = end
        if end < len(request.token_ids):
            return -1  # a prefill chunk short of the end
        token_id = self.next_tokens.pop(request_id, None)
        if token_id is None:
            token_id = self.rng.choice(self.vocab)
        request.token_ids.append(token_id)
        return token_id


def run_until_idle(scheduler, worker: FakeWorker, max_steps: int = 10_000) -> list:
    """Step until nothing is left; returns every RequestUpdate. Checks integrity every step."""
    updates = []
    for _ in range(max_steps):
        plan = scheduler.schedule()
        if plan is None:
            assert not scheduler.has_unfinished_requests, "work left but nothing scheduled"
            return updates
        updates += scheduler.update(plan, worker.run(plan))
        scheduler.check_integrity()
    raise AssertionError("no progress")
