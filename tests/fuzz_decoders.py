"""Coverage-guided fuzz (atheris, libFuzzer) of every decoder of untrusted bytes: the four link
decoders of protocol.codec, codec.salvage_generate, and the gateway's request bodies (JSON) with
the checks that follow them. The promise under test: bad bytes raise the decoder's own error
(ProtocolError, or the gateway's APIError, a 400) and nothing else, and whatever decodes
re-encodes to an equal message.

    python -m tests.fuzz_decoders -runs=200000          # libFuzzer flags; seeds are written first
Run bounded in CI by tests/fuzz/test_fuzz_decoders.py. The Python code around msgspec is
instrumented (msgspec's C code is not: libFuzzer sees Python coverage only).
"""
import os
import sys
import tempfile

import atheris

with atheris.instrument_imports(include=["protocol", "gateway_svc"]):
    import msgspec

    from gateway_svc.completions import prompt_list
    from gateway_svc.errors import APIError
    from gateway_svc.openai_requests import ChatCompletionRequest, CompletionRequest, decode_body, \
        refuse_unsupported, sampling_params
    from protocol import ProtocolError
    from protocol.codec import (client_to_scheduler_decoder, encode, salvage_generate, scheduler_to_client_decoder,
                                scheduler_to_worker_decoder, worker_to_scheduler_decoder)

DECODERS = [client_to_scheduler_decoder(), scheduler_to_client_decoder(), worker_to_scheduler_decoder(),
            scheduler_to_worker_decoder()]
NUM_TARGETS = len(DECODERS) + 3  # + salvage, completions, chat


def fuzz_link(decoder, frame: bytes) -> None:
    try:
        message = decoder.decode(frame)
    except ProtocolError:
        return
    assert decoder.decode(encode(message)) == message, "a decoded message does not survive re-encoding"


def fuzz_salvage(frame: bytes) -> None:
    salvaged = salvage_generate(frame)
    if salvaged is not None:
        valid, invalid = salvaged
        assert all(isinstance(rid, str) and isinstance(error, str) for rid, error in invalid)


def fuzz_body(body: bytes, kind: type) -> None:
    try:
        req = decode_body(body, kind)
        refuse_unsupported(req)
        if kind is CompletionRequest:
            prompt_list(req.prompt, 2048)
        sampling_params(req, req.max_tokens or 16, req.logprobs if kind is CompletionRequest else None)
    except APIError as e:
        assert e.status == 400, e.status


def TestOneInput(data: bytes) -> None:
    if len(data) < 1:
        return
    target, payload = data[0] % NUM_TARGETS, data[1:]
    if target < len(DECODERS):
        fuzz_link(DECODERS[target], payload)
    elif target == len(DECODERS):
        fuzz_salvage(payload)
    else:
        fuzz_body(payload, CompletionRequest if target == len(DECODERS) + 1 else ChatCompletionRequest)


def write_seeds(folder: str) -> None:
    """Valid messages of every type (the codec tests' own), and valid request bodies."""
    from tests.sample_messages import LINKS
    for link, (messages, _) in enumerate(LINKS):
        for i, message in enumerate(messages):
            with open(os.path.join(folder, f"link{link}-{i}"), "wb") as f:
                f.write(bytes([link]) + encode(message))
            with open(os.path.join(folder, f"salvage-{link}-{i}"), "wb") as f:
                f.write(bytes([len(DECODERS)]) + encode(message))
    bodies = [(1, {"prompt": "hi", "max_tokens": 4, "stop": ["\n"], "logprobs": 2, "n": 2}),
              (1, {"prompt": [[1, 2], [3]], "temperature": 0.5, "top_k": 3}),
              (2, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "logprobs": True,
                   "top_logprobs": 2})]
    for i, (offset, body) in enumerate(bodies):
        with open(os.path.join(folder, f"body-{i}"), "wb") as f:
            f.write(bytes([len(DECODERS) + offset]) + msgspec.json.encode(body))


def main() -> None:
    seeds = tempfile.mkdtemp(prefix="stepserve-fuzz-")
    write_seeds(seeds)
    atheris.Setup([sys.argv[0], *sys.argv[1:], seeds], TestOneInput)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
