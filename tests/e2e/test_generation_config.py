"""generation_config.json: its sampling defaults fill what a request leaves unset (SDK, LLM and
the gateway, through real processes), `generation_config="vllm"` / `--generation-config vllm`
ignores them, and its extra EOS ids stop requests either way (vLLM reads those always)."""
import argparse
import json
import os

import msgspec
import pytest

from protocol.sampling import SamplingDefaults
from stepserve import LLM, SamplingParams
from stepserve.cluster_args import add_cluster_flags, cluster_args
from tests.e2e_helpers import TEST_WORKER_ARGS, hf_greedy
from tests.gateway_helpers import post_json
from tests.hf_model_folders import make_llama_folder
from worker_svc.__main__ import parse_args as worker_parse_args
from worker_svc.loader import sampling_defaults

PROMPT = [5, 17, 99, 230, 7]


def _hf_penalised_greedy(folder: str, max_new_tokens: int) -> list[int]:
    import torch
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    out = model.generate(torch.tensor([PROMPT]), do_sample=False, max_new_tokens=max_new_tokens,
                         repetition_penalty=1.3, eos_token_id=None, pad_token_id=0)
    return out[0, len(PROMPT):].tolist()


@pytest.fixture(scope="module")
def folder_and_greedy(tmp_path_factory):
    """A folder whose generation_config.json asks for greedy decoding with a repetition penalty
    (and top_k / top_p), with an extra EOS id: the token that decoding gives PROMPT third.
    Returns the folder, plain greedy tokens and the penalised ones (transformers' both)."""
    folder = make_llama_folder(str(tmp_path_factory.mktemp("generation") / "llama"))
    greedy = hf_greedy(folder, [PROMPT], 8)[0]  # before the file below exists
    penalised = _hf_penalised_greedy(folder, 8)
    assert penalised != greedy, "the penalty must change this prompt's tokens"
    extra_eos = penalised[2]
    assert extra_eos not in penalised[:2] and extra_eos != 2
    path = os.path.join(folder, "generation_config.json")
    with open(path) as f:
        config = json.load(f)
    config.update(temperature=0.0, top_k=5, top_p=0.9, repetition_penalty=1.3, eos_token_id=[2, extra_eos],
                  do_sample=True, max_new_tokens=6)
    with open(path, "w") as f:
        json.dump(config, f)
    return folder, greedy, penalised


def test_transformers_defaults_in_the_file_are_not_the_models_choice(tmp_path):
    with open(tmp_path / "generation_config.json", "w") as f:
        json.dump({"temperature": 1.0, "top_k": 50, "top_p": 0.95, "max_new_tokens": None}, f)
    assert sampling_defaults(str(tmp_path)) == SamplingDefaults(top_p=0.95)  # vLLM reads to_diff_dict: top_p alone
    assert sampling_defaults(None) == SamplingDefaults()


def test_the_cluster_flag_reaches_the_worker():
    parser = argparse.ArgumentParser()
    add_cluster_flags(parser)
    worker_argv = cluster_args(parser.parse_args(["--generation-config", "vllm"]))[1]
    assert worker_argv == ["--generation-config", "vllm"]
    assert worker_parse_args(worker_argv).generation_config == "vllm"
    assert "--generation-config" not in cluster_args(parser.parse_args([]))[1]


def test_defaults_fill_unset_fields_in_the_sdk_llm_and_gateway(folder_and_greedy):
    folder, greedy, penalised = folder_and_greedy
    # greedy (temperature 0 from the file) with its repetition penalty, stopped by the extra EOS id
    expected = penalised[:3]
    with LLM(folder, worker_args=TEST_WORKER_ARGS) as llm:
        info = llm.client.model_info()
        assert info.sampling_defaults == SamplingDefaults(temperature=0.0, top_k=5, top_p=0.9,
                                                          repetition_penalty=1.3, max_tokens=6)
        assert penalised[2] in info.eos_token_ids and 2 in info.eos_token_ids
        defaults = llm.get_default_sampling_params()
        assert (defaults.temperature, defaults.top_k, defaults.top_p) == (0.0, 5, 0.9)
        assert (defaults.repetition_penalty, defaults.max_tokens) == (1.3, 6)
        (out,) = llm.generate([PROMPT])  # no sampling_params: the model's defaults
        assert out.outputs[0].token_ids == expected and out.outputs[0].finish_reason == "stop"
        # An explicit SamplingParams is taken as it is (vLLM's LLM too): no EOS, 8 tokens
        (out,) = llm.generate([PROMPT], SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))
        assert out.outputs[0].token_ids == greedy
        url = llm.cluster.start_gateway()
        status, body = post_json(url + "/v1/completions", {"prompt": PROMPT, "max_tokens": 8,
                                                           "return_token_ids": True})
        assert status == 200, body
        choice = json.loads(body)["choices"][0]
        assert choice["token_ids"] == expected and choice["finish_reason"] == "stop"
        # A field the request sets wins over the model's default
        status, body = post_json(url + "/v1/completions", {"prompt": PROMPT, "max_tokens": 8, "top_k": 1,
                                                           "temperature": 1.0, "return_token_ids": True})
        assert json.loads(body)["choices"][0]["token_ids"] == expected  # top_k 1: greedy by another road
        # No max_tokens: the file's max_new_tokens, not the room left in the model's length
        status, body = post_json(url + "/v1/completions", {"prompt": PROMPT, "ignore_eos": True,
                                                           "return_token_ids": True})
        assert json.loads(body)["choices"][0]["token_ids"] == penalised[:6]


def test_generation_config_vllm_ignores_the_sampling_defaults_not_the_eos_ids(folder_and_greedy):
    folder, _, penalised = folder_and_greedy
    with LLM(folder, worker_args=TEST_WORKER_ARGS, generation_config="vllm") as llm:
        info = llm.client.model_info()
        assert info.sampling_defaults == SamplingDefaults() and penalised[2] in info.eos_token_ids
        assert msgspec.structs.asdict(llm.get_default_sampling_params()) == msgspec.structs.asdict(SamplingParams())
