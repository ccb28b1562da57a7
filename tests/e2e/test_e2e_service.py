"""End to end: real scheduler and worker processes on loopback, real ZeroMQ, real torch."""
import asyncio

import pytest
import zmq
import zmq.asyncio

from client_sdk import AsyncClient, RequestError, SamplingParams
from stepserve.launcher import LocalCluster
from protocol import ErrorCode
from protocol.client_messages import ErrorReply, Generate, GenerateRequest, HealthQuery, RequestOutputs
from protocol.codec import encode, scheduler_to_client_decoder
from tests.e2e_helpers import (COMPILED_WORKER_ARGS, TEST_WORKER_ARGS, hf_greedy, random_prompts, wait_for_waiting,
                               wait_until_idle)

GREEDY = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=8)


@pytest.fixture(scope="module")
def cluster(llama_folder):
    # The compiled step, end to end (the thousand prompts equal transformers through it).
    with LocalCluster(llama_folder, 1, worker_args=COMPILED_WORKER_ARGS,
                      scheduler_args=["--max-num-seqs", "64"]) as running:
        yield running


async def test_thousand_prompts_match_transformers(client, llama_folder):
    info = await client.model_info()
    prompts = random_prompts(1000, info.vocab_size)
    outputs = await client.generate_batch(prompts, GREEDY)
    assert [o.outputs[0].finish_reason for o in outputs] == ["length"] * 1000
    assert all(o.num_prompt_tokens == 16 for o in outputs)
    expected = hf_greedy(llama_folder, prompts, GREEDY.max_tokens)
    assert [o.outputs[0].token_ids for o in outputs] == expected


async def test_mixed_lengths_match_transformers(client, llama_folder):
    info = await client.model_info()
    prompts = random_prompts(24, info.vocab_size, lengths=(1, 3, 17, 40, 90), seed=1)
    params = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=12)
    outputs = await client.generate_batch(prompts, params)
    assert [o.outputs[0].token_ids for o in outputs] == hf_greedy(llama_folder, prompts, 12)
    assert all(o.outputs[0].text is not None for o in outputs)


async def test_stream_deltas_concatenate_to_the_final_output(client):
    params = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=20)
    whole = (await client.generate("hello world", params)).outputs[0]
    deltas = [d async for d in client.stream("hello world", params)]
    assert sum((d.token_ids for d in deltas), []) == whole.token_ids
    assert "".join(d.text for d in deltas) == whole.text
    assert [d.finish_reason for d in deltas][-1] == "length"
    assert all(d.finish_reason is None for d in deltas[:-1])
    assert len(deltas) > 1


async def test_abort_mid_stream_frees_blocks(client):
    params = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=500)
    deltas = []
    async for delta in client.stream([5, 6, 7], params, request_id="to-abort"):
        deltas.append(delta)
        if len(deltas) == 3:
            await client.abort("to-abort")
    assert deltas[-1].finish_reason == "abort"
    assert sum(len(d.token_ids) for d in deltas) < 500
    health = await wait_until_idle(client)
    assert health.num_free_blocks == health.num_total_blocks
    await client.abort("to-abort")  # idempotent


async def test_vanishing_client_harms_no_other(cluster, client):
    params = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=400)
    doomed = AsyncClient(cluster.address)
    stream = doomed.stream([9, 10, 11], params)
    await stream.__anext__()
    doomed._transport._sock.close(linger=0)  # vanish without a word: no abort is sent
    doomed._transport._reader.cancel()
    survivors = await client.generate_batch(random_prompts(20, 1000, seed=3), GREEDY)
    assert all(len(o.outputs[0].token_ids) == GREEDY.max_tokens for o in survivors)
    health = await wait_until_idle(client)
    assert health.num_running == 0 and health.num_free_blocks == health.num_total_blocks


async def test_bad_frames_and_params_get_errors_and_service_keeps_serving(cluster, client):
    ctx = zmq.asyncio.Context()
    raw = ctx.socket(zmq.DEALER)
    raw.connect(cluster.address)
    decoder = scheduler_to_client_decoder()
    try:
        for garbage in (b"", b"\x01", b"\x07whatever", b"\x01\xc1\xc1", encode(HealthQuery())[:1] + b"\x93"):
            await raw.send(garbage)
            reply = decoder.decode(await asyncio.wait_for(raw.recv(), 10))
            assert isinstance(reply, ErrorReply) and reply.code == ErrorCode.BAD_FRAME
        await raw.send_multipart([b"two", b"frames"])
        reply = decoder.decode(await asyncio.wait_for(raw.recv(), 10))
        assert isinstance(reply, ErrorReply)
        # One Generate with a good request and a bad one: the bad one fails alone.
        good = GenerateRequest("good-1", [5, 6], GREEDY)
        bad = GenerateRequest("bad-1", [5, 6], SamplingParams(temperature=-1.0))
        await raw.send(encode(Generate([good, bad])))
        outputs = {}
        while len(outputs) < 2:
            reply = decoder.decode(await asyncio.wait_for(raw.recv(), 30))
            assert isinstance(reply, RequestOutputs)
            outputs.update({o.request_id: o for o in reply.outputs})
        assert outputs["bad-1"].finish_reason == "error"
        assert outputs["bad-1"].error_code == ErrorCode.INVALID_PARAMS
        assert outputs["good-1"].finish_reason == "length"
        assert len(outputs["good-1"].new_token_ids) == GREEDY.max_tokens
    finally:
        raw.close(0)
        ctx.term()
    with pytest.raises(ValueError):
        await client.generate([1, 2], SamplingParams(top_p=0.0))
    info = await client.model_info()
    with pytest.raises(RequestError) as err:
        await client.generate([4] * (info.max_model_len + 1), GREEDY)
    assert err.value.code == ErrorCode.PROMPT_TOO_LONG
    with pytest.raises(RequestError) as err:
        await client.generate([info.vocab_size + 5], GREEDY)
    assert err.value.code == ErrorCode.INVALID_PARAMS
    out = await client.generate([5, 6, 7], GREEDY)
    assert len(out.outputs[0].token_ids) == GREEDY.max_tokens


async def test_duplicate_live_id_is_refused(llama_folder):
    # No worker: the first request stays live (waiting) for as long as the test needs, however
    # fast the machine; with one, a request of 300 tokens could end before the duplicate arrives.
    with LocalCluster(llama_folder, 0, worker_args=TEST_WORKER_ARGS) as cluster:
        # other's timeout: a duplicate wrongly taken would wait for a worker forever.
        async with AsyncClient(cluster.address, timeout_s=30) as client, \
                AsyncClient(cluster.address, request_timeout_s=10) as other:
            first = asyncio.ensure_future(client.generate([5, 6], GREEDY, request_id="same-id"))
            await wait_for_waiting(client, 1)
            with pytest.raises(RequestError) as err:
                await other.generate([5, 6], GREEDY, request_id="same-id")
            assert err.value.code == ErrorCode.DUPLICATE_ID
            with pytest.raises(ValueError):  # the same client: refused before it reaches the server
                await client.generate([5, 6], GREEDY, request_id="same-id")
            await client.abort("same-id")
            assert (await first).outputs[0].finish_reason == "abort"
            again = asyncio.ensure_future(client.generate([5, 6], GREEDY, request_id="same-id"))  # after abort
            await wait_for_waiting(client, 1)  # taken, not refused (the aborted first no longer waits)
            await client.abort("same-id")
            assert (await again).outputs[0].finish_reason == "abort"


async def test_requests_sent_before_any_worker_complete_once_one_joins(llama_folder):
    with LocalCluster(llama_folder, 0, worker_args=TEST_WORKER_ARGS) as cluster:
        async with AsyncClient(cluster.address, timeout_s=60) as client:
            pending = asyncio.ensure_future(client.generate_batch([[5, 6, 7]] * 10, GREEDY))
            health = await wait_for_waiting(client, 10)
            assert health.num_workers == 0
            cluster.add_worker()
            outputs = await asyncio.wait_for(pending, 120)
            assert all(len(o.outputs[0].token_ids) == GREEDY.max_tokens for o in outputs)
            assert len({tuple(o.outputs[0].token_ids) for o in outputs}) == 1


async def test_the_cluster_says_the_worker_compiles_and_what_it_runs(cluster, client):
    assert any(line.startswith("compiling the model's step (torch.compile)") for line in cluster.status_lines)
    assert cluster.status_lines[-1].startswith(f"{cluster.model}, float32 on cpu, compiled step; ready in ")
    info = await client.model_info()
    assert (info.dtype, info.device, info.compiled) == ("float32", "cpu", True)
