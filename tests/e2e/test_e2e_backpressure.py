"""Backpressure and input limits, with real processes on loopback: past --max-queued-requests each
request that does not fit gets `overloaded` at once; a waiting request costs the scheduler no
more memory than before (~600 bytes); a flood far larger than the limit completes through the
SDK's window; every bound on a request's fields fails that request alone.

Memory per waiting request, measured in the scheduler process (Request, prompt list, sampling
params, the book's entries) with 16-token prompts, from 50,000 to 100,000 waiting: 965 bytes
before this work (main at 397df6e) and after it, 982 with async scheduling's two counters per
request; ~900 between two resizes of the dicts; the core alone holds ~600
(benchmarks/scheduler_overhead.py)."""
import asyncio

import msgspec

from benchmarks.flood import flood, rss_mb
from client_sdk import AsyncClient, SamplingParams
from protocol import ErrorCode, PROTOCOL_VERSION
from protocol.client_messages import ErrorReply, Generate, GenerateRequest
from protocol.codec import encode
from protocol.limits import MAX_PROMPT_TOKENS, MAX_REQUESTS_PER_MESSAGE
from stepserve.launcher import LocalCluster
from tests.e2e_helpers import ONE_THREAD_WORKER_ARGS, wait_for_waiting
from tests.raw_client import RawClient

PARAMS = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=4)


def generate(ids: list[str], prompt_len: int = 16) -> Generate:
    return Generate([GenerateRequest(rid, [5 + i % 900 for i in range(prompt_len)], PARAMS) for rid in ids])


async def test_past_the_limit_each_request_is_refused_at_once_and_a_waiting_one_costs_under_1000_bytes():
    # The cost of a waiting request is the scheduler's growth from 50,000 waiting to 100,000: what
    # the first requests allocate once (buffers, code run for the first time) is in both, and each
    # dict of requests grows once in a doubling, so its growth is amortized as it is at any size.
    with LocalCluster("unused", 0, scheduler_args=["--max-queued-requests", "100050"]) as cluster:  # no worker
        raw = RawClient(cluster.address)
        try:
            async with AsyncClient(cluster.address, timeout_s=30) as client:
                rss_mb_at = {}
                for step in range(0, 100_000, 10_000):  # taken in, step by step: no backlog of frames
                    for start in range(step, step + 10_000, MAX_REQUESTS_PER_MESSAGE):
                        end = min(start + MAX_REQUESTS_PER_MESSAGE, step + 10_000)
                        await raw.send(encode(generate([f"r{i}" for i in range(start, end)])))
                    await wait_for_waiting(client, step + 10_000)
                    rss_mb_at[step + 10_000] = rss_mb(cluster.scheduler.pid, "VmRSS")
                await raw.send(encode(generate([f"x{i}" for i in range(200)])))
                await raw.receive_until(lambda r: len(r.outputs) == 150)
                assert all(o[0].error_code == ErrorCode.OVERLOADED for o in raw.outputs.values())
                assert (await client.health()).num_waiting == 100_050
            per_request = (rss_mb_at[100_000] - rss_mb_at[50_000]) * (1 << 20) / 50_000
            print(f"scheduler memory per waiting request (16-token prompts, 50,000 to 100,000 waiting): "
                  f"{per_request:.0f} bytes")
            assert per_request < 1000
        finally:
            raw.close()


async def test_a_flood_many_times_the_limit_completes_through_the_window():
    with LocalCluster("micro-llama", 1, worker_args=ONE_THREAD_WORKER_ARGS,
                      scheduler_args=["--max-queued-requests", "4000", "--max-num-seqs", "512"]) as cluster:
        result = await flood(cluster, 20_000, prompt_len=4, window=None)  # the SDK's default: half the limit
    print(f"flood: {result}")
    assert result["num_completed"] == 20_000 and result["errors"] == []
    assert result["scheduler_peak_rss_mb"] < 400


async def test_each_limit_fails_its_request_alone():
    with LocalCluster("micro-llama", 1, worker_args=ONE_THREAD_WORKER_ARGS) as cluster:
        raw = RawClient(cluster.address)
        try:
            def request(rid, prompt=(5, 6, 7), **params):
                fields = {**msgspec.to_builtins(PARAMS), **params}
                return [rid, list(prompt), fields, 0, False]

            bad = [request("long-prompt", [5] * (MAX_PROMPT_TOKENS + 1)), request("many-tokens", max_tokens=1 << 21),
                   request("many-stops", stop_token_ids=list(range(2000))), request("many-logprobs", logprobs=21),
                   request("x" * 257)]
            good = request("good")
            frame = bytes([PROTOCOL_VERSION]) + msgspec.msgpack.encode({"type": "Generate", "requests": [*bad, good]})
            await raw.send(frame)
            await raw.receive_until(lambda r: len(r.outputs) == 6)
            assert {rid for rid, o in raw.outputs.items() if o[-1].error_code == ErrorCode.INVALID_PARAMS} == {
                "long-prompt", "many-tokens", "many-stops", "many-logprobs", "x" * 257}  # an id past the limit too
            assert raw.outputs["good"][-1].finish_reason == "length"

            too_many = [request(f"m{i}") for i in range(MAX_REQUESTS_PER_MESSAGE + 1)]
            await raw.send(bytes([PROTOCOL_VERSION]) + msgspec.msgpack.encode({"type": "Generate",
                                                                                "requests": too_many}))
            await raw.receive_until(lambda r: len(r.outputs) == 6 + len(too_many))
            assert all(raw.outputs[f"m{i}"][0].error_code == ErrorCode.INVALID_PARAMS for i in range(len(too_many)))
            abort = {"type": "Abort", "request_ids": [f"a{i}" for i in range(MAX_REQUESTS_PER_MESSAGE + 1)]}
            await raw.send(bytes([PROTOCOL_VERSION]) + msgspec.msgpack.encode(abort))
            reply = raw.decoder.decode(await asyncio.wait_for(raw.sock.recv(), 10))
            assert isinstance(reply, ErrorReply) and reply.code == ErrorCode.BAD_FRAME
        finally:
            raw.close()
        async with AsyncClient(cluster.address, timeout_s=30) as client:
            assert (await client.generate([5, 6, 7], PARAMS)).outputs[0].finish_reason == "length"
