"""Greedy generation through the runner equals transformers' generate, token for token.

Same random weights (a saved Hugging Face folder, float32). Prompts of different lengths run
together under plans that mix prefill, chunked prefill and decode, preempt one request
(recompute) and swap another out and back in. The sliding-window families (Mistral, Gemma 2,
Gemma 3) have an 8-token window, shorter than most prompts plus their outputs.
"""
import pytest
import torch

from protocol.sampling import SamplingParams
from tests.hf_model_folders import (make_gemma2_folder, make_gemma3_folder, make_llama_folder, make_mistral_folder,
                                    make_opt_folder, make_qwen2_folder, make_qwen3_folder, without_sliding_window)
from tests.plan_player import PlanPlayer
from worker_svc.model_executor import num_compilations
from worker_svc.runner import ModelRunner
from worker_svc.runner_config import RunnerConfig

NUM_NEW_TOKENS = 10
PROMPT_LENS = [3, 17, 9, 40]


def _prompts(vocab_size: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(1)
    return [torch.randint(4, vocab_size, (n,), generator=generator).tolist() for n in PROMPT_LENS]


def _hf_greedy(folder: str, prompts: list[list[int]]) -> list[list[int]]:
    from transformers import AutoModelForCausalLM
    outputs = []
    for prompt in prompts:  # one at a time: no padding, so positions are plain
        # A fresh model per prompt: transformers' dynamic rope keeps the frequencies of the
        # longest sequence seen until a shorter one resets them, so each output is its prompt's alone.
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        ids = model.generate(torch.tensor([prompt]), max_new_tokens=NUM_NEW_TOKENS,
                             min_new_tokens=NUM_NEW_TOKENS, do_sample=False)
        outputs.append(ids[0, len(prompt):].tolist())
    return outputs


def _runner_greedy(folder: str, prompts, events, token_budget: int,
                   enforce_eager: bool = False) -> list[list[int]]:
    runner = ModelRunner(RunnerConfig(model=folder, dtype="float32", block_size=4,
                                      num_gpu_blocks=128, swap_space_gb=0.001,
                                      enforce_eager=enforce_eager))
    assert runner.num_cpu_blocks >= 32 and runner.executor.compiled != enforce_eager
    compilations_after_warm_up = num_compilations()
    player = PlanPlayer(runner, token_budget=token_budget)
    # min_tokens = max_tokens bans EOS throughout, as min_new_tokens does in generate.
    params = SamplingParams(temperature=0.0, max_tokens=NUM_NEW_TOKENS, min_tokens=NUM_NEW_TOKENS)
    for i, prompt in enumerate(prompts):
        player.add(f"req-{i}", prompt, params)
    outputs = player.run(events)
    assert -1 in {t for r in player.results for t in r.sampled_token_ids}, "no prefill was chunked"
    # Every batch shape of the run (prefills, chunks, decodes, mixes of each) took the graphs
    # compiled at start-up.
    assert num_compilations() == compilations_after_warm_up
    return [outputs[f"req-{i}"] for i in range(len(prompts))]



# Budget 16: the 17- and 40-token prompts are chunked over several steps while the others
# decode. Step 4 preempts req-0 mid-decode (recompute); step 6 swaps req-1 out, step 7 back in.
EVENTS = {4: {"preempt": ("req-0",)}, 6: {"swap_out": ("req-1",)}}


FAMILIES = {"llama": make_llama_folder, "opt": make_opt_folder, "qwen2": make_qwen2_folder, "qwen3": make_qwen3_folder,
            "mistral-window": make_mistral_folder, "gemma2": make_gemma2_folder, "gemma3": make_gemma3_folder}
WINDOWED = ["mistral-window", "gemma2", "gemma3"]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_greedy_matches_transformers(tmp_path, family):
    folder = FAMILIES[family](str(tmp_path / "model"))
    prompts = _prompts(1000)
    expected = _hf_greedy(folder, prompts)
    assert _runner_greedy(folder, prompts, EVENTS, token_budget=16) == expected


@pytest.mark.parametrize("family", ["llama"] + WINDOWED)
def test_the_eager_path_matches_transformers_too(tmp_path, family):
    folder = FAMILIES[family](str(tmp_path / "model"))
    prompts = _prompts(1000)
    assert _runner_greedy(folder, prompts, EVENTS, token_budget=16, enforce_eager=True) == \
        _hf_greedy(folder, prompts)


@pytest.mark.parametrize("family", WINDOWED)
def test_the_sliding_window_changes_the_tokens(tmp_path, family):
    """Without its window the same weights give other tokens, so the tests above would fail
    had the window been ignored."""
    folder = FAMILIES[family](str(tmp_path / "model"))
    prompts = _prompts(1000)
    assert _hf_greedy(folder, prompts) != _hf_greedy(without_sliding_window(folder, str(tmp_path / "global")), prompts)


def test_llama_gqa_head_dim_and_tied_embeddings(tmp_path):
    folder = make_llama_folder(str(tmp_path / "model"), num_key_value_heads=2, head_dim=32,
                               tie_word_embeddings=True, attention_bias=True, rope_theta=500.0)
    prompts = _prompts(1000)
    assert _runner_greedy(folder, prompts, {}, token_budget=16) == _hf_greedy(folder, prompts)


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
    prompts = _prompts(1000)
    assert _runner_greedy(folder, prompts, EVENTS, token_budget=16, enforce_eager=True) == \
        _hf_greedy(folder, prompts)


def test_gemma3_with_linear_rope_scaling_on_its_global_layers(tmp_path):
    """As Gemma 3 4B and larger ship: linear scaling (factor 8) on the global layers' rotary,
    none on the local layers'."""
    rope = {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1_000_000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 100.0}}
    folder = make_gemma3_folder(str(tmp_path / "model"), rope_parameters=rope)
    prompts = _prompts(1000)
    assert _runner_greedy(folder, prompts, EVENTS, token_budget=16, enforce_eager=True) == \
        _hf_greedy(folder, prompts)
