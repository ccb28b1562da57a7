"""The real scheduler against a scripted stand-in worker (a test tool speaking the real
protocol over real ZeroMQ), for faults a healthy worker never shows: failed steps, bad frames,
answers to steps that are not in flight."""
import asyncio

import pytest
import zmq
import zmq.asyncio

from client_sdk import AsyncClient, RequestError, SamplingParams
from protocol import ErrorCode
from protocol.codec import encode, scheduler_to_worker_decoder
from protocol.worker_messages import StepPlan, StepResult, WorkerHello
from stepserve.launcher import LocalCluster

PARAMS = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=2)


class ScriptedWorker:
    """Says hello, then answers each plan through `answer(plan) -> StepResult | None`."""

    def __init__(self, address: str):
        self.ctx = zmq.asyncio.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.connect(address)
        self.decoder = scheduler_to_worker_decoder()
        self.plans: list[StepPlan] = []

    async def hello(self) -> None:
        await self.sock.send(encode(WorkerHello(
            worker_id="scripted", model="scripted", device="cpu", dtype="float32", vocab_size=100,
            max_model_len=64, block_size=16, num_gpu_blocks=32, num_cpu_blocks=0, num_state_slots=0,
            eos_token_ids=[2], tokenizer_json=None)))

    async def serve(self, answer) -> None:
        while True:
            plan = self.decoder.decode(await self.sock.recv())
            self.plans.append(plan)
            result = answer(plan)
            if result is not None:
                await self.sock.send(result if isinstance(result, bytes) else encode(result))

    def close(self) -> None:
        self.sock.close(0)
        self.ctx.term()


def tokens_for(plan: StepPlan, token: int = 7) -> list[int]:
    return [token] * plan.num_scheduled


@pytest.fixture
async def scheduler():
    with LocalCluster("unused", 0, scheduler_args=["--worker-timeout", "600"]) as cluster:
        worker = ScriptedWorker(cluster.worker_address)
        await worker.hello()
        async with AsyncClient(cluster.address, timeout_s=30) as client:
            await client.wait_for_workers(1)
            yield client, worker
        worker.close()


async def test_a_failed_step_fails_its_requests_alone_and_serving_goes_on(scheduler):
    client, worker = scheduler
    failed_once = []

    def answer(plan: StepPlan):
        if plan.new_requests and not failed_once:
            failed_once.append(plan.step_id)
            return StepResult(plan.step_id, [], error="RuntimeError: out of memory")
        return StepResult(plan.step_id, tokens_for(plan))

    serving = asyncio.ensure_future(worker.serve(answer))
    with pytest.raises(RequestError) as err:
        await client.generate([5, 6, 7], PARAMS)
    assert err.value.code == ErrorCode.WORKER_ERROR and "out of memory" in err.value.message
    out = await client.generate([5, 6, 7], PARAMS)
    assert out.outputs[0].token_ids == [7, 7]
    # The failed request's id reached the worker so it could free its state.
    failed_id = worker.plans[0].new_requests[0].request_id
    assert any(failed_id in p.finished_ids for p in worker.plans[1:])
    health = await client.health()
    assert health.num_free_blocks == health.num_total_blocks
    serving.cancel()


async def test_garbage_and_stale_answers_from_a_worker_are_ignored(scheduler):
    client, worker = scheduler

    def answer(plan: StepPlan):
        return StepResult(plan.step_id, tokens_for(plan, 9))

    async def noisy_serve():
        await worker.sock.send(b"\x01not msgpack")
        await worker.sock.send(encode(StepResult(12345, [1, 2, 3])))  # no such step in flight
        await worker.serve(answer)

    serving = asyncio.ensure_future(noisy_serve())
    outs = await client.generate_batch([[5, 6], [7, 8, 9]], PARAMS)
    assert [o.outputs[0].token_ids for o in outs] == [[9, 9], [9, 9]]
    serving.cancel()
