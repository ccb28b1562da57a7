"""Sparse mixtures of experts (Mixtral, Qwen3-MoE) vs transformers on the same saved weights.

Greedy tokens through the runner, compiled and eager, under plans that mix prefill, chunked
prefill and decode, preempt one request and swap another (the plans of test_models_vs_hf); the
MoE block alone against transformers' blocks (both routings: renormalised or not); both weight
layouts (per-expert on disk, stacked in memory), sharded for tensor parallelism.
"""
import pytest
import torch

from protocol.sampling import SamplingParams
from tests.hf_model_folders import make_mixtral_folder, make_qwen3_moe_folder, without_sliding_window
from tests.plan_player import PlanPlayer
from tests.runner_greedy import EVENTS, NUM_NEW_TOKENS, hf_greedy_each, runner_greedy, sample_prompts
from worker_svc.loader import load_model
from worker_svc.models.gated_mlp import GatedMLP
from worker_svc.models.mixtral import MixtralForCausalLM
from worker_svc.models.sparse_moe import SparseMoe, moe_experts
from worker_svc.parallel import TensorParallel
from worker_svc.runner import ModelRunner
from worker_svc.runner_config import RunnerConfig


@pytest.fixture(scope="module")
def mixtral_folder(tmp_path_factory):
    return make_mixtral_folder(str(tmp_path_factory.mktemp("mixtral") / "model"))


@pytest.fixture(scope="module")
def qwen3_moe_folder(tmp_path_factory):
    return make_qwen3_moe_folder(str(tmp_path_factory.mktemp("qwen3_moe") / "model"))


@pytest.mark.parametrize("enforce_eager", [False, True], ids=["compiled", "eager"])
@pytest.mark.parametrize("family", ["mixtral", "qwen3_moe"])
def test_greedy_matches_transformers(request, family, enforce_eager):
    folder = request.getfixturevalue(f"{family}_folder")
    prompts = sample_prompts(1000)
    expected = hf_greedy_each(folder, prompts)
    assert len({tuple(t) for t in expected}) == len(prompts), "degenerate reference"
    assert runner_greedy(folder, prompts, EVENTS, token_budget=16, enforce_eager=enforce_eager) == expected


def test_mixtral_with_mistral_sliding_window(tmp_path):
    """Mixtral's attention is Mistral's: an 8-token window, shorter than most prompts plus their
    outputs, changes the tokens, and the eager path still equals transformers."""
    folder = make_mixtral_folder(str(tmp_path / "model"), sliding_window=8)
    prompts = sample_prompts(1000)
    expected = hf_greedy_each(folder, prompts)
    assert expected != hf_greedy_each(without_sliding_window(folder, str(tmp_path / "global")), prompts)
    assert runner_greedy(folder, prompts, EVENTS, token_budget=16, enforce_eager=True) == expected


def test_qwen3_moe_layer_plan(qwen3_moe_folder):
    model = load_model(qwen3_moe_folder, dtype="float32", load_format="dummy").model
    assert [type(layer.mlp) for layer in model.layers] == [SparseMoe, GatedMLP, SparseMoe]
    assert model.layers[0].mlp.experts.gate_up_proj.shape == (4, 2 * 48, 64)
    assert not model.layers[0].mlp.gate.renormalize


def test_bfloat16_runs_end_with_full_lengths(mixtral_folder):
    prompts = sample_prompts(1000)
    runner = ModelRunner(RunnerConfig(model=mixtral_folder, dtype="bfloat16", block_size=4, num_gpu_blocks=128,
                                      swap_space_gb=0.001, enforce_eager=True))
    player = PlanPlayer(runner, token_budget=16)
    for i, prompt in enumerate(prompts):
        player.add(f"req-{i}", prompt, SamplingParams(temperature=0.0, max_tokens=NUM_NEW_TOKENS, ignore_eos=True))
    outputs = player.run(EVENTS)
    assert [len(outputs[f"req-{i}"]) for i in range(len(prompts))] == [NUM_NEW_TOKENS] * len(prompts)
    assert all(0 <= t < 1000 for tokens in outputs.values() for t in tokens)
    assert len({tuple(t) for t in outputs.values()}) == len(prompts), "degenerate outputs"


def _hf_block_and_ours(family: str, seed: int):
    """transformers' MoE block with random weights, and ours holding the same weights."""
    torch.manual_seed(seed)
    if family == "mixtral":
        from transformers import MixtralConfig
        from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock as Block
        config = MixtralConfig(hidden_size=32, intermediate_size=48, num_local_experts=6, num_experts_per_tok=2)
        renormalize, inter = True, 48
    else:
        from transformers import Qwen3MoeConfig
        from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock as Block
        config = Qwen3MoeConfig(hidden_size=32, moe_intermediate_size=40, num_experts=6, num_experts_per_tok=3,
                                norm_topk_prob=family == "qwen3_moe_norm")
        renormalize, inter = family == "qwen3_moe_norm", 40
    config._experts_implementation = "eager"  # transformers' per-expert loop: the plainest reference
    hf = Block(config).eval()
    with torch.no_grad():
        for param in hf.parameters():
            param.normal_(0, 0.3)
    ours = SparseMoe(32, inter, 6, config.num_experts_per_tok, renormalize, torch.float32, TensorParallel())
    ours.load_state_dict(hf.state_dict())
    return hf, ours


@pytest.mark.parametrize("family", ["mixtral", "qwen3_moe", "qwen3_moe_norm"])
def test_block_matches_transformers(family):
    hf, ours = _hf_block_and_ours(family, seed=3)
    x = torch.randn(1, 50, 32)
    with torch.no_grad():
        torch.testing.assert_close(ours(x[0]), hf(x)[0], atol=1e-5, rtol=1e-5)


def test_tensor_parallel_shards_sum_to_the_whole_block():
    """Two ranks' blocks, each loaded from the full weights, give partial sums of the output."""
    hf, whole = _hf_block_and_ours("mixtral", seed=4)
    ranks = [SparseMoe(32, 48, 6, 2, True, torch.float32, TensorParallel(2, r)) for r in range(2)]
    x = torch.randn(20, 32)
    for rank in ranks:
        for name, param in rank.named_parameters():
            module_name, _, param_name = name.rpartition(".")
            module = rank.get_submodule(module_name)
            full = hf.state_dict()[name]
            param.data.copy_(module.shard(param_name, full) if hasattr(module, "shard") else full)
    with torch.no_grad():  # the block's all_reduce by hand: the ranks are not a process group here
        partial = [moe_experts(x, *rank.gate(x), rank.experts.gate_up_proj, rank.experts.down_proj)
                   for rank in ranks]
        torch.testing.assert_close(partial[0] + partial[1], whole(x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("tp_size", [1, 2])
def test_stacked_and_per_expert_checkpoints_load_alike(mixtral_folder, tp_size):
    """save_pretrained writes Mixtral's experts one by one (block_sparse_moe.experts.{e}.w1 ...);
    transformers 5 holds them stacked in memory (mlp.experts.gate_up_proj). Both load, on
    every rank of a group."""
    from transformers import AutoModelForCausalLM
    stacked = AutoModelForCausalLM.from_pretrained(mixtral_folder, dtype=torch.float32).state_dict()
    assert "model.layers.0.mlp.experts.gate_up_proj" in stacked
    for rank in range(tp_size):
        tp = TensorParallel(tp_size, rank)
        from_folder = load_model(mixtral_folder, dtype="float32", tp=tp).model
        from_memory = MixtralForCausalLM(from_folder.config, torch.float32, tp)
        from_memory.load_weights(stacked.items())
        for (name, a), (_, b) in zip(from_folder.named_parameters(), from_memory.named_parameters()):
            assert torch.equal(a, b), name


def test_missing_expert_weight_is_an_error(mixtral_folder):
    from safetensors.torch import load_file
    weights = load_file(f"{mixtral_folder}/model.safetensors")
    del weights["model.layers.1.block_sparse_moe.experts.2.w3.weight"]
    model = MixtralForCausalLM(load_model(mixtral_folder, load_format="dummy").config, torch.float32)
    with pytest.raises(KeyError, match=r"layers\.1\.mlp\.experts\.2\.up_proj"):
        model.load_weights(weights.items())


def test_tiny_mixtral_preset_ranks_hold_slices_of_one_workers_random_weights():
    """Seeded random experts are drawn whole and sliced, like Linears: a group of two holds
    exactly the weights of one worker alone."""
    whole = load_model("tiny-mixtral", dtype="float32").model.layers[1].mlp.experts
    ranks = [load_model("tiny-mixtral", dtype="float32", tp=TensorParallel(2, r)).model.layers[1].mlp.experts
             for r in range(2)]
    assert whole.gate_up_proj.shape == (8, 2 * 688, 256)
    inter = 688 // 2
    for part in range(2):  # gate rows, then up rows, each split between the ranks
        full = whole.gate_up_proj[:, part * 688:(part + 1) * 688]
        shards = [rank.gate_up_proj[:, part * inter:(part + 1) * inter] for rank in ranks]
        assert torch.equal(torch.cat(shards, dim=1), full)
    assert torch.equal(torch.cat([rank.down_proj for rank in ranks], dim=2), whole.down_proj)
