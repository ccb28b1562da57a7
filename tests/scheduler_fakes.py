"""A stand-in for the worker that mirrors its per-request state and checks every plan.

It keeps what a real worker keeps between steps (token ids, computed count, block table) and
asserts the plan is consistent with that: new requests are unknown to it, running ones known,
block tables only grow, nothing computes past its tokens or its blocks.

It also mirrors the KV cache's contents: each slot of each block (device and CPU) holds what
the real KV there is a function of, the token ids up to and including that position. Swaps and
copies move the mirror as the worker moves the KV. Every computation then checks that the
context it reads (cached prefix, swapped-in blocks, earlier chunks) holds its own tokens, and
that it writes only into blocks no other request holds: a block handed out with the wrong
contents, or freed while another request still reads it, fails at once.

It answers a pooling request (NewRequestData.pooling) as a pooling model does: its whole prompt in
one step, -1 as its token and pooled_values(prompt) as its result; it asserts one is never
chunked nor scheduled again.

Beside it, the small builders the core's tests share: make_scheduler, make_request, step.
"""
import random
import struct
from collections import defaultdict

from protocol.pooling import PoolingInfo, PoolingParams
from protocol.sampling import SamplingParams
from protocol.worker_messages import StepPlan, StepResult
from scheduler_svc.config import SchedulerConfig, WorkerCapacity
from scheduler_svc.request import Request
from scheduler_svc.scheduler import Scheduler


class WorkerRequest:
    __slots__ = ("token_ids", "num_computed_tokens", "block_ids")

    def __init__(self, token_ids, num_computed_tokens, block_ids):
        self.token_ids = list(token_ids)
        self.num_computed_tokens = num_computed_tokens
        self.block_ids = list(block_ids)


class FakeWorker:
    def __init__(self, block_size: int, vocab: list[int] | None = None, seed: int = 0,
                 deterministic: bool = False):
        """deterministic: each sampled token is a function of the tokens before it (like greedy
        decoding), so runs that schedule differently must produce the same outputs."""
        self.block_size = block_size
        self.deterministic = deterministic
        self.vocab = vocab or list(range(10, 100))
        self.rng = random.Random(seed)
        self.requests: dict[str, WorkerRequest] = {}
        self.next_tokens: dict[str, int] = {}  # forced tokens for the next step, by id
        self.kv: dict[int, list] = {}  # device block -> per slot: tuple(token_ids[:pos + 1]) or None
        self.cpu_kv: dict[int, list] = {}
        self.holders: dict[int, set[str]] = defaultdict(set)  # device block -> requests holding it
        self.num_cached_tokens_read = 0  # context tokens a new request found already computed
        self.pooling_ids: set[str] = set()  # pooling requests it computed: never scheduled again

    def run(self, plan: StepPlan) -> StepResult:
        for request_id in plan.finished_ids:
            self._forget(request_id)  # unknown ids are ignored
        for request_id in plan.preempted_ids:
            assert request_id in self.requests, f"preempted {request_id} is unknown to the worker"
            self._forget(request_id)
        # A device block shared by several requests is a source once per request that swaps
        # out or copies it; a CPU block belongs to one request; no block is written twice.
        for pairs in (plan.blocks_to_swap_out, plan.blocks_to_swap_in, plan.blocks_to_copy):
            assert len({dst for _, dst in pairs}) == len(pairs), "a block is written twice"
        assert len({src for src, _ in plan.blocks_to_swap_in}) == len(plan.blocks_to_swap_in)
        self._move(self.kv, self.cpu_kv, plan.blocks_to_swap_out)
        self._move(self.cpu_kv, self.kv, plan.blocks_to_swap_in)
        self._move(self.kv, self.kv, plan.blocks_to_copy)
        sampled, pooled = [], {}
        for data in plan.new_requests:
            assert data.request_id not in self.requests, f"{data.request_id} sent as new twice"
            request = WorkerRequest(data.token_ids, data.num_computed_tokens, data.block_ids)
            self.requests[data.request_id] = request
            self._hold(data.request_id, data.block_ids)
            if data.num_computed_tokens and not plan.blocks_to_swap_in:
                self.num_cached_tokens_read += data.num_computed_tokens
            if data.pooling is not None:
                assert data.num_computed_tokens == 0 and data.num_new_tokens == len(data.token_ids), \
                    f"pooling request {data.request_id} is not computed whole in one step"
                self.pooling_ids.add(data.request_id)
                pooled[len(sampled)] = pooled_values(data.token_ids)
                sampled.append(-1)
                continue
            sampled.append(self._compute(data.request_id, request, data.num_new_tokens))
        for data in plan.running_requests:
            assert data.request_id not in self.pooling_ids, f"pooling request {data.request_id} scheduled twice"
            request = self.requests[data.request_id]
            request.block_ids += data.new_block_ids
            self._hold(data.request_id, data.new_block_ids)
            sampled.append(self._compute(data.request_id, request, data.num_new_tokens))
        return StepResult(step_id=plan.step_id, sampled_token_ids=sampled, pooled=pooled)

    def _forget(self, request_id: str) -> None:
        request = self.requests.pop(request_id, None)
        if request is not None:
            for block_id in request.block_ids:
                self.holders[block_id].discard(request_id)

    def _hold(self, request_id: str, block_ids: list[int]) -> None:
        for block_id in block_ids:
            self.holders[block_id].add(request_id)

    def _move(self, src: dict, dst: dict, pairs) -> None:
        for src_block, dst_block in pairs:
            if dst is self.kv:
                assert not self.holders[dst_block], f"block {dst_block} overwritten while held"
            dst[dst_block] = list(src.get(src_block) or [None] * self.block_size)

    def _compute(self, request_id: str, request: WorkerRequest, num_new: int) -> int:
        assert num_new > 0
        start = request.num_computed_tokens
        end = start + num_new
        assert end <= len(request.token_ids), "computes past its tokens"
        assert end <= len(request.block_ids) * self.block_size, "computes past its blocks"
        block_size, tokens = self.block_size, request.token_ids
        for pos in range(start, end):  # write this step's KV
            block_id = request.block_ids[pos // block_size]
            assert self.holders[block_id] == {request_id}, \
                f"{request_id} writes into block {block_id}, which {self.holders[block_id]} also hold"
            self.kv.setdefault(block_id, [None] * block_size)[pos % block_size] = tuple(tokens[:pos + 1])
        for pos in range(end):  # attention reads the whole context
            slots = self.kv.get(request.block_ids[pos // block_size])
            assert slots is not None and slots[pos % block_size] == tuple(tokens[:pos + 1]), \
                f"{request_id} reads KV of other tokens at position {pos}"
        request.num_computed_tokens = end
        if end < len(request.token_ids):
            return -1  # a prefill chunk short of the end
        token_id = self.next_tokens.pop(request_id, None)
        if token_id is None and self.deterministic:
            token_id = self.vocab[hash(tuple(tokens)) % len(self.vocab)]
        elif token_id is None:
            token_id = self.rng.choice(self.vocab)
        request.token_ids.append(token_id)
        return token_id


def run_until_idle(scheduler, worker: FakeWorker, max_steps: int = 10_000) -> list:
    """Step until nothing is left; returns every RequestUpdate. Checks integrity every step."""
    updates = []
    for _ in range(max_steps):
        plan = scheduler.schedule()
        if plan is None:
            assert scheduler.num_waiting == scheduler.num_running == scheduler.num_swapped == 0, \
                "work left but nothing scheduled"
            return updates
        updates += scheduler.update(plan, worker.run(plan))
        scheduler.check_integrity()
    raise AssertionError("no progress")


EOS = 2  # the eos token id of make_scheduler's capacity


def pooled_values(token_ids: list[int]) -> bytes:
    """The fake worker's pooled result: float32 values that are a function of the prompt."""
    return struct.pack("<2f", len(token_ids), sum(token_ids))


EMBED_MODEL = PoolingInfo(task="embed", size=2, normalize=True, pooling_type="CLS", bidirectional=True)


def make_scheduler(num_gpu_blocks=64, block_size=4, num_cpu_blocks=0, num_state_slots=0,
                   max_model_len=256, pooling: PoolingInfo | None = None, **config):
    return Scheduler(SchedulerConfig(**config),
                     WorkerCapacity(num_gpu_blocks=num_gpu_blocks, block_size=block_size, num_cpu_blocks=num_cpu_blocks,
                                    num_state_slots=num_state_slots, max_model_len=max_model_len,
                                    eos_token_ids=(EOS,), pooling=pooling))


def make_request(request_id="r", prompt_len=4, priority=0, pooling: PoolingParams | None = None, **params):
    params.setdefault("max_tokens", 8)
    return Request(request_id, list(range(100, 100 + prompt_len)), SamplingParams(**params), priority=priority,
                   pooling=pooling)


def step(scheduler, worker):
    plan = scheduler.schedule()
    return plan, scheduler.update(plan, worker.run(plan))
