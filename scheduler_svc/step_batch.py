"""What the core's schedule() works with: the batch one call is building (StepBatch) and each
plan sent whose result is not applied yet (StepInFlight). scheduler.py is their one user."""
from protocol.worker_messages import NewRequestData, RunningRequestData, StepPlan
from scheduler_svc.request import Request


class StepBatch:
    """What one schedule() call has decided so far. Each scheduled request is added with its
    plan entry in one call, so a request and its entry are never apart."""

    __slots__ = ("token_budget", "new_requests", "new_scheduled", "running_requests",
                 "running_scheduled", "preempted_ids", "swap_out", "swap_in", "copies")

    def __init__(self, token_budget: int):
        self.token_budget = token_budget
        self.new_requests: list[NewRequestData] = []
        self.new_scheduled: list[Request] = []  # new_requests[i] is new_scheduled[i]'s
        self.running_requests: list[RunningRequestData] = []
        self.running_scheduled: list[Request] = []  # likewise
        self.preempted_ids: list[str] = []
        self.swap_out: list[tuple[int, int]] = []
        self.swap_in: list[tuple[int, int]] = []
        self.copies: list[tuple[int, int]] = []  # copy-on-write of a fully cached last block

    def add_new(self, request: Request, data: NewRequestData) -> None:
        self.new_requests.append(data)
        self.new_scheduled.append(request)
        self.token_budget -= data.num_new_tokens

    def add_running(self, request: Request, data: RunningRequestData) -> None:
        self.running_requests.append(data)
        self.running_scheduled.append(request)
        self.token_budget -= data.num_new_tokens


class StepInFlight:
    """A plan returned by schedule() whose result is not applied yet.

    scheduled: (request, tokens it computes, whether the step samples a token for it), in the
    plan's order (new requests, then running ones), which is the order of the worker's sampled
    tokens: the result is matched to it by step id and count (ids on the wire would cost ~40
    bytes per request per step). Empty for a free-only plan."""

    __slots__ = ("plan", "scheduled")

    def __init__(self, plan: StepPlan, scheduled: list[tuple[Request, int, bool]]):
        self.plan = plan
        self.scheduled = scheduled
