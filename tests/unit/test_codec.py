"""Codec: every message round-trips; bad frames and out-of-range values raise ProtocolError only."""
import msgspec
import pytest
from hypothesis import given, settings, strategies as st

from protocol import PROTOCOL_VERSION, ProtocolError, SamplingParams
from protocol import client_messages as cm
from protocol import worker_messages as wm
from protocol.codec import client_to_scheduler_decoder, encode, scheduler_to_worker_decoder
from tests.sample_messages import ALL_DECODERS, ALL_MESSAGES, LINKS, SCHEDULER_TO_WORKER, WORKER_TO_SCHEDULER


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
    ["r", [1, 2], {}, 0, False, {"token_type_ids": [0]}],  # a segment id per prompt token
    ["r", [1], {}, 0, False, {"token_type_ids": [-1]}],
    ["r", [1], {}, 0, False, {"task": "generate"}],
    ["r", [1], {}, 0, False, {"dimensions": 0}],
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
