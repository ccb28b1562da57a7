"""Greedy generation through the runner equals transformers' generate, token for token.

Same random weights (a saved Hugging Face folder, float32). Prompts of different lengths run
together under plans that mix prefill, chunked prefill and decode, preempt one request
(recompute) and swap another out and back in. The sliding-window families (Mistral, Gemma 2,
Gemma 3) have an 8-token window, shorter than most prompts plus their outputs.
"""
import pytest

from tests.hf_model_folders import (make_gemma2_folder, make_gemma3_folder, make_llama_folder, make_mistral_folder,
                                    make_opt_folder, make_qwen2_folder, make_qwen3_folder, without_sliding_window)
from tests.runner_greedy import EVENTS, hf_greedy_each, runner_greedy, sample_prompts

FAMILIES = {"llama": make_llama_folder, "opt": make_opt_folder, "qwen2": make_qwen2_folder, "qwen3": make_qwen3_folder,
            "mistral-window": make_mistral_folder, "gemma2": make_gemma2_folder, "gemma3": make_gemma3_folder}
WINDOWED = ["mistral-window", "gemma2", "gemma3"]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_greedy_matches_transformers(tmp_path, family):
    """Compiled, every step all-greedy: tokens from the forward's own greedy head."""
    folder = FAMILIES[family](str(tmp_path / "model"))
    prompts = sample_prompts(1000)
    expected = hf_greedy_each(folder, prompts)
    assert runner_greedy(folder, prompts, EVENTS, token_budget=16, argmax_only=True) == expected


@pytest.mark.parametrize("argmax_only", [True, False])
def test_the_graph_called_from_cpp_matches_transformers_too(tmp_path, monkeypatch, argmax_only):
    """Real-size CPU models' graphs make their calls from C++ (inductor's cpp_wrapper,
    model_executor.CPP_WRAPPER_FROM_BYTES): here a small one's, with the greedy head and with
    the full logits (EOS banned: the sampler's path)."""
    import torch._inductor.config as inductor_config

    from worker_svc import model_executor
    monkeypatch.setattr(model_executor, "CPP_WRAPPER_FROM_BYTES", 0)
    monkeypatch.setattr(inductor_config, "cpp_wrapper", inductor_config.cpp_wrapper)  # restored after
    folder = make_qwen3_folder(str(tmp_path / "model"))
    prompts = sample_prompts(1000)
    expected = hf_greedy_each(folder, prompts)
    assert runner_greedy(folder, prompts, EVENTS, token_budget=16, argmax_only=argmax_only) == expected
    assert inductor_config.cpp_wrapper


@pytest.mark.parametrize("family", ["llama"] + WINDOWED)
def test_the_eager_path_matches_transformers_too(tmp_path, family):
    folder = FAMILIES[family](str(tmp_path / "model"))
    prompts = sample_prompts(1000)
    assert runner_greedy(folder, prompts, EVENTS, token_budget=16, enforce_eager=True) == \
        hf_greedy_each(folder, prompts)


@pytest.mark.parametrize("family", WINDOWED)
def test_the_sliding_window_changes_the_tokens(tmp_path, family):
    """Without its window the same weights give other tokens, so the tests above would fail
    had the window been ignored."""
    folder = FAMILIES[family](str(tmp_path / "model"))
    prompts = sample_prompts(1000)
    assert hf_greedy_each(folder, prompts) != hf_greedy_each(without_sliding_window(folder, str(tmp_path / "global")), prompts)


def test_llama_gqa_head_dim_and_tied_embeddings(tmp_path):
    """Compiled, EOS banned (min_tokens): tokens from the sampler over full logits."""
    folder = make_llama_folder(str(tmp_path / "model"), num_key_value_heads=2, head_dim=32,
                               tie_word_embeddings=True, attention_bias=True, rope_theta=500.0)
    prompts = sample_prompts(1000)
    assert runner_greedy(folder, prompts, {}, token_budget=16) == hf_greedy_each(folder, prompts)


def test_gemma3_folder_in_the_older_config_style(tmp_path):
    """Gemma 3 as folders saved before transformers 5 describe it: sliding_window_pattern instead
    of layer_types, rope_theta and rope_local_base_freq instead of per-layer-type
    rope_parameters (transformers converts them on load; so must we)."""
    import json
    folder = make_gemma3_folder(str(tmp_path / "model"), num_hidden_layers=3,
                                layer_types=["sliding_attention", "full_attention", "sliding_attention"])
    path = f"{folder}/config.json"
    with open(path) as f:
        config = json.load(f)
    rope = config.pop("rope_parameters")
    del config["layer_types"]
    config.update(sliding_window_pattern=2, rope_theta=rope["full_attention"]["rope_theta"],
                  rope_local_base_freq=rope["sliding_attention"]["rope_theta"], rope_scaling=None)
    with open(path, "w") as f:
        json.dump(config, f)
    prompts = sample_prompts(1000)
    assert runner_greedy(folder, prompts, EVENTS, token_budget=16, enforce_eager=True) == \
        hf_greedy_each(folder, prompts)


def test_gemma3_with_linear_rope_scaling_on_its_global_layers(tmp_path):
    """As Gemma 3 4B and larger ship: linear scaling (factor 8) on the global layers' rotary,
    none on the local layers'."""
    rope = {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1_000_000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 100.0}}
    folder = make_gemma3_folder(str(tmp_path / "model"), rope_parameters=rope)
    prompts = sample_prompts(1000)
    assert runner_greedy(folder, prompts, EVENTS, token_budget=16, enforce_eager=True) == \
        hf_greedy_each(folder, prompts)
