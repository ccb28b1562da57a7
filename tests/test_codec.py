"""Codec: every message round-trips; bad frames and out-of-range values raise ProtocolError only."""
import msgspec
import pytest
from hypothesis import given, settings, strategies as st

from protocol import PROTOCOL_VERSION, ProtocolError, SamplingParams
from protocol import client_messages as cm
from protocol import worker_messages as wm
from protocol.codec import (client_to_scheduler_decoder, encode, scheduler_to_client_decoder,
                            scheduler_to_worker_decoder, worker_to_scheduler_decoder)

PARAMS = SamplingParams(max_tokens=32, min_tokens=2, temperature=0.7, top_p=0.9, top_k=40,
                        min_p=0.05, seed=7, stop_token_ids=[5, 6], ignore_eos=True, logprobs=3)
LOGPROBS = cm.TokenLogprobs(token_id=3, logprob=-0.25, top_token_ids=[3, 4], top_logprobs=[-0.25, -2.0])

CLIENT_TO_SCHEDULER = [
    cm.Generate(requests=[cm.GenerateRequest("a", [1, 2, 3], PARAMS, priority=2, stream=True),
                          cm.GenerateRequest("b", [0], SamplingParams())]),
    cm.Generate(requests=[]),
    cm.Abort(request_ids=["a", "b"]),
    cm.ModelInfoQuery(),
    cm.HealthQuery(),
]
SCHEDULER_TO_CLIENT = [
    cm.RequestOutputs(outputs=[
        cm.RequestOutput("a", [7, 8], 3, "stop", [LOGPROBS, LOGPROBS]),
        cm.RequestOutput("b", [], 1, "error", None, "worker_error", "boom"),
        cm.RequestOutput("c", [9], 4)]),
    cm.ErrorReply(code="bad_frame", message="nope"),
    cm.ModelInfo(model="tiny-llama", vocab_size=32000, max_model_len=2048, eos_token_ids=[2],
                 tokenizer_json="{}", num_replicas=2),
    cm.ModelInfo(model=None),
    cm.Health(num_waiting=1, num_running=2, num_swapped=3, num_workers=1, num_free_blocks=4,
              num_total_blocks=5, num_free_state_slots=6, num_total_state_slots=7, steps_per_s=1.5,
              num_steps=8, num_finished=9, worker_kv_blocks_in_use=10, worker_state_slots_in_use=11,
              num_cached_blocks=12, num_prefix_cache_queries=13, num_prefix_cache_hits=14),
]
WORKER_TO_SCHEDULER = [
    wm.WorkerHello(worker_id="w0", model="tiny-llama", device="cpu", dtype="bfloat16", vocab_size=32000,
                   max_model_len=2048, block_size=16, num_gpu_blocks=100, num_cpu_blocks=10,
                   num_state_slots=0, eos_token_ids=[2], tokenizer_json=None, tensor_parallel_size=2, rank=1),
    wm.StepResult(step_id=3, sampled_token_ids=[5, -1, 7], logprobs=[LOGPROBS, None, LOGPROBS]),
    wm.StepResult(step_id=4, sampled_token_ids=[], error="oom"),
    wm.Heartbeat(worker_id="w0", num_kv_blocks_in_use=3, num_state_slots_in_use=1, num_requests=2),
]
SCHEDULER_TO_WORKER = [
    wm.StepPlan(step_id=9, finished_ids=["x"], preempted_ids=["y"],
                new_requests=[wm.NewRequestData("a", [1, 2, 3, 4], 3, PARAMS, [0, 1], 0, 4)],
                running_requests=[wm.RunningRequestData("b", [2], 1), wm.RunningRequestData("c", [], 1)],
                blocks_to_swap_out=[(1, 2)], blocks_to_swap_in=[(3, 4)], blocks_to_copy=[(5, 6)]),
    wm.StepPlan(step_id=10, finished_ids=["x"], preempted_ids=[], new_requests=[], running_requests=[]),
    wm.Shutdown(reason="bye"),
    wm.HeartbeatReply(instance_id="abc123", known=False),
]
LINKS = [
    (CLIENT_TO_SCHEDULER, client_to_scheduler_decoder),
    (SCHEDULER_TO_CLIENT, scheduler_to_client_decoder),
    (WORKER_TO_SCHEDULER, worker_to_scheduler_decoder),
    (SCHEDULER_TO_WORKER, scheduler_to_worker_decoder),
]
ALL_MESSAGES = [m for messages, _ in LINKS for m in messages]
ALL_DECODERS = [make() for _, make in LINKS]


@pytest.mark.parametrize("message,make_decoder",
                         [(m, make) for messages, make in LINKS for m in messages],
                         ids=lambda v: type(v).__name__ if isinstance(v, msgspec.Struct) else "")
def test_round_trip(message, make_decoder):
    frame = encode(message)
    assert frame[0] == PROTOCOL_VERSION
    decoded = make_decoder().decode(frame)
    assert type(decoded) is type(message)
    assert decoded == message


def test_every_message_type_is_covered():
    types = {type(m) for m in ALL_MESSAGES}
    for union in (cm.ClientToScheduler, cm.SchedulerToClient, wm.WorkerToScheduler, wm.SchedulerToWorker):
        assert set(union.__args__) <= types


def test_message_on_the_wrong_link_is_rejected():
    with pytest.raises(ProtocolError):
        client_to_scheduler_decoder().decode(encode(SCHEDULER_TO_WORKER[0]))
    with pytest.raises(ProtocolError):
        scheduler_to_worker_decoder().decode(encode(WORKER_TO_SCHEDULER[1]))


def test_wrong_version_is_rejected():
    frame = bytearray(encode(cm.HealthQuery()))
    frame[0] = PROTOCOL_VERSION + 1
    with pytest.raises(ProtocolError, match="version"):
        client_to_scheduler_decoder().decode(bytes(frame))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_raise_protocol_error_only(data):
    for decoder in ALL_DECODERS:
        for frame in (data, bytes([PROTOCOL_VERSION]) + data):
            try:
                decoder.decode(frame)
            except ProtocolError:
                pass  # anything else propagates and fails the test


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(range(len(ALL_MESSAGES))), st.data())
def test_truncated_frames_raise_protocol_error(index, data):
    frame = encode(ALL_MESSAGES[index])
    cut = data.draw(st.integers(0, len(frame) - 1))
    for decoder in ALL_DECODERS:
        with pytest.raises(ProtocolError):
            decoder.decode(frame[:cut])


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(range(len(ALL_MESSAGES))), st.data())
def test_corrupted_frames_raise_protocol_error_only(index, data):
    frame = bytearray(encode(ALL_MESSAGES[index]))
    position = data.draw(st.integers(1, len(frame) - 1))
    frame[position] = data.draw(st.integers(0, 255))
    for decoder in ALL_DECODERS:
        try:
            decoder.decode(bytes(frame))
        except ProtocolError:
            pass


def _generate_frame_with_params(**overrides) -> bytes:
    """A Generate frame whose params carry raw (unvalidated) values."""
    params = msgspec.to_builtins(SamplingParams())
    params.update(overrides)
    message = {"type": "Generate", "requests": [["r", [1, 2], params, 0, False]]}
    return bytes([PROTOCOL_VERSION]) + msgspec.msgpack.encode(message)


def test_valid_params_frame_decodes():
    decoded = client_to_scheduler_decoder().decode(_generate_frame_with_params(temperature=0.0, top_p=1.0))
    assert decoded.requests[0].params.temperature == 0.0


@pytest.mark.parametrize("overrides", [
    {"temperature": -0.1}, {"temperature": float("nan")}, {"temperature": float("inf")},
    {"top_p": 0.0}, {"top_p": 1.5}, {"top_k": -2}, {"min_p": 1.5}, {"min_p": -0.1},
    {"max_tokens": 0}, {"max_tokens": -1}, {"min_tokens": -1}, {"min_tokens": 17, "max_tokens": 16},
    {"stop_token_ids": [-1]}, {"n": 0}, {"n": 129}, {"stop": [""]}, {"logprobs": -1}, {"logprobs": 21}, {"no_such_field": 1},
    {"max_tokens": "16"},
])
def test_out_of_range_params_are_rejected(overrides):
    with pytest.raises(ProtocolError):
        client_to_scheduler_decoder().decode(_generate_frame_with_params(**overrides))


@pytest.mark.parametrize("request_fields", [
    ["r", [-1], {}, 0, False],  # negative prompt token id
    ["r", [], {}, 0, False],  # empty prompt
    ["", [1], {}, 0, False],  # empty request id
    ["r" * 257, [1], {}, 0, False],  # request id too long
])
def test_bad_generate_requests_are_rejected(request_fields):
    frame = bytes([PROTOCOL_VERSION]) + msgspec.msgpack.encode({"type": "Generate", "requests": [request_fields]})
    with pytest.raises(ProtocolError):
        client_to_scheduler_decoder().decode(frame)


def test_negative_block_id_in_plan_is_rejected():
    plan = msgspec.to_builtins(SCHEDULER_TO_WORKER[0])
    plan["running_requests"][0][1] = [-3]
    with pytest.raises(ProtocolError):
        scheduler_to_worker_decoder().decode(bytes([PROTOCOL_VERSION]) + msgspec.msgpack.encode(plan))
