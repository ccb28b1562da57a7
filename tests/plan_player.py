"""A test tool that plays scheduler for a ModelRunner: it builds StepPlans, nothing more.

Not the real scheduler (scheduler_svc/ is): a FCFS loop with a token budget per step (so long
prompts are chunked), its own block free lists, and test hooks to preempt (recompute) or swap
out a request at a chosen step; a swapped request is swapped back in on the following step.
"""
from dataclasses import dataclass, field

from protocol.sampling import SamplingParams
from protocol.worker_messages import NewRequestData, RunningRequestData, StepPlan


@dataclass
class _Request:
    request_id: str
    token_ids: list[int]
    num_prompt_tokens: int
    params: SamplingParams
    num_computed: int = 0
    blocks: list[int] = field(default_factory=list)
    cpu_blocks: list[int] = field(default_factory=list)
    known_to_worker: bool = False
    swapped: bool = False

    @property
    def output(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]


class PlanPlayer:
    def __init__(self, runner, token_budget: int = 64):
        self.runner = runner
        self.block_size = runner.block_size
        self.token_budget = token_budget
        self.free_blocks = list(range(runner.num_gpu_blocks))
        self.free_cpu_blocks = list(range(runner.num_cpu_blocks))
        self.active: list[_Request] = []
        self.done: dict[str, _Request] = {}
        self.finished_ids: list[str] = []
        self.step_id = 0
        self.results = []

    def add(self, request_id: str, prompt: list[int], params: SamplingParams) -> None:
        self.active.append(_Request(request_id, list(prompt), len(prompt), params))

    def _request(self, request_id: str) -> _Request:
        return next(r for r in self.active if r.request_id == request_id)

    def step(self, preempt: tuple[str, ...] = (), swap_out: tuple[str, ...] = ()):
        plan = StepPlan(step_id=self.step_id, finished_ids=self.finished_ids, preempted_ids=[],
                        new_requests=[], running_requests=[])
        self.finished_ids = []
        self.step_id += 1
        for request_id in preempt:  # recompute: forget the KV, come back as a new request
            req = self._request(request_id)
            self.free_blocks += req.blocks
            req.blocks, req.num_computed, req.known_to_worker = [], 0, False
            plan.preempted_ids.append(request_id)
        for request_id in swap_out:
            req = self._request(request_id)
            req.cpu_blocks = [self.free_cpu_blocks.pop() for _ in req.blocks]
            plan.blocks_to_swap_out += list(zip(req.blocks, req.cpu_blocks))
            self.free_blocks += req.blocks
            req.blocks, req.swapped, req.known_to_worker = [], True, False
            plan.preempted_ids.append(request_id)
        budget = self.token_budget
        for req in self.active:
            if req.request_id in swap_out or budget == 0:
                continue
            if req.swapped:  # swap back in, with the KV of num_computed tokens
                req.blocks = [self.free_blocks.pop() for _ in req.cpu_blocks]
                plan.blocks_to_swap_in += list(zip(req.cpu_blocks, req.blocks))
                self.free_cpu_blocks += req.cpu_blocks
                req.cpu_blocks, req.swapped = [], False
            num_new = min(len(req.token_ids) - req.num_computed, budget)
            budget -= num_new
            num_blocks = -(-(req.num_computed + num_new) // self.block_size)
            new_blocks = [self.free_blocks.pop() for _ in range(num_blocks - len(req.blocks))]
            req.blocks += new_blocks
            if req.known_to_worker:
                plan.running_requests.append(RunningRequestData(req.request_id, new_blocks, num_new))
            else:
                plan.new_requests.append(NewRequestData(
                    req.request_id, list(req.token_ids), req.num_prompt_tokens, req.params,
                    list(req.blocks), req.num_computed, num_new))
                req.known_to_worker = True
        result = self.runner.execute(plan)
        assert result.error is None, result.error
        self._update(plan, result)
        return result

    def _update(self, plan: StepPlan, result) -> None:
        scheduled = [(n.request_id, n.num_new_tokens) for n in plan.new_requests]
        scheduled += [(r.request_id, r.num_new_tokens) for r in plan.running_requests]
        assert len(result.sampled_token_ids) == len(scheduled)
        self.results.append(result)
        for (request_id, num_new), token in zip(scheduled, result.sampled_token_ids):
            req = self._request(request_id)
            req.num_computed += num_new
            if token == -1:
                assert req.num_computed < len(req.token_ids)
                continue
            assert req.num_computed == len(req.token_ids)
            req.token_ids.append(token)
            if len(req.output) == req.params.max_tokens:
                self.active.remove(req)
                self.done[request_id] = req
                self.free_blocks += req.blocks
                self.finished_ids.append(request_id)

    def run(self, events: dict[int, dict] | None = None, max_steps: int = 1000) -> dict[str, list[int]]:
        """Steps until every request finished; events[step] = step()'s keyword arguments."""
        events = events or {}
        while self.active:
            assert self.step_id < max_steps
            self.step(**events.get(self.step_id, {}))
        return {request_id: req.output for request_id, req in self.done.items()}
