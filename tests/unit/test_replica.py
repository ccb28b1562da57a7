"""Replica: a worker lost with two steps in flight (async scheduling) fails both answers, and
the one nobody awaits is not reported as an exception never retrieved (the soak saw asyncio's
ERROR line for it at every worker killed)."""
import asyncio
import gc
from types import SimpleNamespace

import pytest

from protocol.worker_messages import WorkerHello
from scheduler_svc.config import SchedulerConfig
from scheduler_svc.replica import Replica, WorkerLost


async def test_a_lost_worker_leaves_no_answer_unretrieved():
    reported = []
    asyncio.get_running_loop().set_exception_handler(lambda loop, context: reported.append(context))
    hello = WorkerHello(worker_id="w", model="tiny-llama", device="cpu", dtype="float32", vocab_size=100,
                        max_model_len=64, block_size=4, num_gpu_blocks=32, num_cpu_blocks=0,
                        num_state_slots=0, eos_token_ids=[2], tokenizer_json=None)
    replica = Replica("w", hello, SchedulerConfig())
    for step_id in (1, 2):
        replica.begin_step(SimpleNamespace(step_id=step_id))
    oldest = replica.answers[1]
    replica.fail()
    with pytest.raises(WorkerLost):
        await oldest  # the step loop awaits the oldest step alone, then ends
    del oldest
    gc.collect()
    assert reported == []
