"""Code written for vLLM's LLM runs unchanged on ours (here on a tensor-parallel group of two
worker processes)."""
import time

import pytest

from client_sdk import ChatTemplateError
from stepserve import LLM, SamplingParams
from tests.e2e_helpers import hf_greedy

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]


@pytest.fixture(scope="module")
def llm(chat_folder):
    with LLM(model=chat_folder, tensor_parallel_size=2, dtype="float32", kv_cache_gb=0.05, seed=0) as llm:
        yield llm


def test_vllm_quickstart_runs_unchanged(llm, chat_folder):
    # vLLM's quickstart, as written for vLLM (plus ignore_eos, so the lengths are known).
    prompts = ["Hello, my name is", "The capital of France is"]
    sampling_params = [SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True),
                       SamplingParams(temperature=0.8, top_p=0.95, max_tokens=4, ignore_eos=True)]
    outputs = llm.generate(prompts, sampling_params)
    for output in outputs:
        prompt = output.prompt
        generated_text = output.outputs[0].text
        assert isinstance(prompt, str) and isinstance(generated_text, str)
    assert [o.prompt for o in outputs] == prompts and all(o.finished for o in outputs)
    assert [r.num_ranks for r in llm.client.health().replicas] == [2]
    greedy = outputs[0].outputs[0]
    assert greedy.token_ids == hf_greedy(chat_folder, [outputs[0].prompt_token_ids], 6)[0]  # the TP group is exact
    assert greedy.finish_reason == "length" and greedy.index == 0
    assert len(outputs[1].outputs[0].token_ids) == 4
    by_ids = llm.generate({"prompt_token_ids": outputs[0].prompt_token_ids}, sampling_params[0], use_tqdm=False)
    assert by_ids[0].prompt is None and by_ids[0].outputs[0].token_ids == greedy.token_ids


def test_n_choices_and_logprobs(llm):
    out = llm.generate("abc", SamplingParams(n=3, temperature=1.0, max_tokens=6, ignore_eos=True, logprobs=2))[0]
    assert [c.index for c in out.outputs] == [0, 1, 2]
    assert len({tuple(c.token_ids) for c in out.outputs}) == 3  # LLM(seed=0) seeds them, n apart
    for choice in out.outputs:
        assert len(choice.logprobs) == 6
        assert all(token in step for token, step in zip(choice.token_ids, choice.logprobs))
        assert choice.cumulative_logprob == pytest.approx(
            sum(step[token].logprob for token, step in zip(choice.token_ids, choice.logprobs)))


def test_stop_strings_and_stop_tokens(llm):
    greedy = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    whole = llm.generate("stop me", greedy, use_tqdm=False)[0].outputs[0]
    stop = whole.text[9:12]
    cut = whole.text.find(stop)
    stopped, kept = llm.generate(["stop me", "stop me"], [
        SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True, stop=stop),
        SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True, stop=[stop], include_stop_str_in_output=True),
    ], use_tqdm=False)
    first = stopped.outputs[0]
    assert (first.text, first.finish_reason, first.stop_reason) == (whole.text[:cut], "stop", stop)
    assert first.token_ids == whole.token_ids[:len(first.token_ids)] and len(first.token_ids) < 30
    assert kept.outputs[0].text == whole.text[:cut + len(stop)]
    deltas = list(llm.client.stream("stop me", SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True,
                                                              stop=stop, n=2)))
    for index in (0, 1):
        assert "".join(d.text for d in deltas if d.index == index) == whole.text[:cut]
    token = whole.token_ids[5]
    by_token = llm.generate("stop me", SamplingParams(temperature=0.0, max_tokens=30, stop_token_ids=[token]),
                            use_tqdm=False)[0].outputs[0]
    assert by_token.token_ids == whole.token_ids[:whole.token_ids.index(token) + 1]
    assert (by_token.finish_reason, by_token.stop_reason) == ("stop", token)
    deadline = time.monotonic() + 30  # the stopped requests were aborted on the scheduler
    while llm.client.health().num_running:
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_chat_uses_the_models_template(llm, chat_folder):
    from transformers import AutoTokenizer
    expected = list(AutoTokenizer.from_pretrained(chat_folder).apply_chat_template(
        MESSAGES, add_generation_prompt=True, tokenize=True, return_dict=False))
    outputs = llm.chat(MESSAGES, SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True), use_tqdm=False)
    assert outputs[0].prompt_token_ids == expected
    assert outputs[0].outputs[0].token_ids == hf_greedy(chat_folder, [expected], 5)[0]
    assert len(llm.chat([MESSAGES, MESSAGES[1:]], use_tqdm=False)) == 2


def test_a_data_parallel_llm_on_a_preset_reports_its_prompts_and_refuses_chat_without_a_template():
    with LLM("micro-llama", data_parallel_size=1, dtype="float32", kv_cache_gb=0.05, enforce_eager=True) as llm:
        outputs = llm.generate(["hello", [5, 6, 7]], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True),
                               use_tqdm=False)
        completion = outputs[1].outputs[0]
        assert len(completion.token_ids) == 4 and completion.finish_reason == "length"
        assert outputs[1].num_prompt_tokens == 3 and outputs[1].ok
        with pytest.raises(ChatTemplateError, match="no chat template"):  # presets have none
            llm.chat(MESSAGES)
