"""Client-side text: incremental detokenization (DecodeStream), stop strings, chat templates."""
import pytest

from client_sdk.chat_template import render_chat
from client_sdk.completion_text import CompletionText
from client_sdk.errors import ChatTemplateError
from client_sdk.outputs import vllm_logprobs
from client_sdk.tokenizer import TextCodec
from protocol.client_messages import TokenLogprobs
from protocol.sampling import SamplingParams
from worker_svc.byte_tokenizer import byte_tokenizer_json

CODEC = TextCodec(byte_tokenizer_json(1000))
TEXT = "héllo wörld, 日本語 ok"  # multi-byte characters split over byte tokens


def stream_text(token_ids: list[int], params: SamplingParams, step: int = 1) -> tuple[CompletionText, list[str], int]:
    """Pushes the tokens `step` at a time like a stream; returns the text, the deltas, tokens kept."""
    text, deltas, kept = CompletionText(CODEC, params), [], len(token_ids)
    for start in range(0, len(token_ids), step):
        num_kept = text.push(token_ids[start:start + step])
        if num_kept is not None:
            kept = start + num_kept
            break
        deltas.append(text.take_delta(finished=False))
    text.finish(token_ids[:kept])
    deltas.append(text.take_delta(finished=True))
    return text, deltas, kept


@pytest.mark.parametrize("step", [1, 3])
def test_deltas_join_to_the_whole_decode(step):
    ids = CODEC.encode(TEXT)
    text, deltas, _ = stream_text(ids, SamplingParams(), step)
    assert "".join(deltas) == text.text == CODEC.decode(ids) == TEXT
    assert all("\ufffd" not in d for d in deltas)  # no half characters handed out


def test_an_output_that_ends_mid_character_ends_as_a_whole_decode_does():
    ids = CODEC.encode("ok 語")[:-1]  # the last of 語's three bytes missing
    text, deltas, _ = stream_text(ids, SamplingParams())
    assert "".join(deltas) == text.text == CODEC.decode(ids) == "ok \ufffd"


@pytest.mark.parametrize("include", [False, True])
def test_a_stop_string_across_tokens_cuts_the_text_and_the_tokens(include):
    ids = CODEC.encode(TEXT)
    params = SamplingParams(stop=["never", "ld, 日"], include_stop_str_in_output=include)
    text, deltas, kept = stream_text(ids, params)
    cut = TEXT.index("ld, 日")
    assert text.text == (TEXT[:cut + len("ld, 日")] if include else TEXT[:cut])
    assert text.stop_reason == "ld, 日"
    assert "".join(deltas) == text.text  # nothing of the stop string leaked into a delta
    assert CODEC.decode(ids[:kept]).endswith("日")  # the token completing the match is the last kept


def test_the_earliest_stop_string_wins():
    text, _, _ = stream_text(CODEC.encode("abcdef"), SamplingParams(stop=["de", "bc"]))
    assert (text.text, text.stop_reason) == ("a", "bc")


def test_vllm_logprobs_shape():
    steps = [TokenLogprobs(70, -0.5, [70, 71], [-0.5, -1.5]), TokenLogprobs(72, -3.0, [71], [-0.1])]
    out = vllm_logprobs(steps, CODEC.decode_each)
    assert out[0][70].rank == 1 and out[0][71].rank == 2 and out[0][70].logprob == -0.5
    assert out[1][72].rank is None and out[1][72].logprob == -3.0 and out[1][71].rank == 1
    assert out[0][70].decoded_token == CODEC.decode_each([70])[0]


def test_chat_templates_render_with_transformers_extras():
    template = ("{% for m in messages %}{% if m['role'] == 'bad' %}{{ raise_exception('no bad roles') }}{% endif %}"
                "{% generation %}{{ m['content'] | tojson }}{% endgeneration %}{% endfor %}{{ eos_token }}")
    rendered = render_chat(template, [{"role": "user", "content": [{"type": "text", "text": "a"},
                                                                   {"type": "text", "text": "ü"}]}],
                           {"eos_token": "</s>"})
    assert rendered == '"a\\nü"</s>'  # parts joined, tojson keeps non-ASCII as transformers' does
    with pytest.raises(ChatTemplateError, match="no bad roles"):
        render_chat(template, [{"role": "bad", "content": "x"}], {})


def test_the_sdk_and_the_gateway_import_no_torch():
    """A client install (and a gateway host) need no torch."""
    import subprocess
    import sys
    code = ("import sys, client_sdk, stepserve.cli, gateway_svc.app, gateway_svc.__main__, stepserve.bench.serving; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
